package protocol

import (
	"encoding/json"

	"github.com/valyala/fasthttp"
)

// JSON is how one wire answers with a JSON body. The surfaces and the /v0
// API answer alike but for these two points, which their clients see.
type JSON struct {
	// Newline ends every body with a newline, as every wire does but
	// AAP's.
	Newline bool
	// Fallback is the body of the 500 answered instead of a value that
	// does not encode, in the wire's own error shape (without the
	// newline).
	Fallback string
}

// Write answers with status and v as compact JSON, replacing any body set
// before. A value that does not encode is answered 500 with j.Fallback,
// and its error returned for the caller to log.
func (j JSON) Write(ctx *fasthttp.RequestCtx, status int, v any) error {
	var err error
	if j.Newline {
		// An Encoder writes nothing unless the whole value encodes, and
		// then straight into the response, newline included.
		ctx.Response.ResetBody()
		err = json.NewEncoder(ctx.Response.BodyWriter()).Encode(v)
	} else {
		var data []byte
		if data, err = json.Marshal(v); err == nil {
			ctx.SetBody(data)
		}
	}
	if err != nil {
		status = fasthttp.StatusInternalServerError
		ctx.SetBodyString(j.Fallback)
		if j.Newline {
			ctx.Response.AppendBodyString("\n")
		}
	}
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	return err
}
