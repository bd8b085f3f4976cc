package gateway

import (
	"strconv"

	"github.com/valyala/fasthttp"

	"github.com/gatehouse-dev/gatehouse/ident"
)

// checkRequestIDs checks the ids every route may carry outside its body,
// before its handler runs: the path's parameters, each an id (an
// execution, runner, step, action, session or tool), and the
// Idempotency-Key header, on any route, so that a bad key is a 400 rather
// than a key silently dropped.
func checkRequestIDs(ctx *fasthttp.RequestCtx, params []string) error {
	for i, p := range params {
		// The field's name is built only for the error: the check of every
		// request's parameters allocates nothing.
		if ident.Check("", p) != nil {
			return kernelValidation(ident.Check("path parameter "+strconv.Itoa(i+1), p).Error())
		}
	}
	if k := ctx.Request.Header.Peek("Idempotency-Key"); k != nil {
		if err := ident.Check("Idempotency-Key header", string(k)); err != nil {
			return kernelValidation(err.Error())
		}
	}
	return nil
}
