package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/gatehouse-dev/gatehouse/gateway"
)

// servePprof serves Go's profiles (net/http/pprof) on addr, a loopback
// address of its own: a profile shows the gateway's inner workings and
// costs CPU while it runs, so it is never on the API's port and never
// reachable from another machine. It returns the address it listens on
// and a function that stops it.
func servePprof(addr string, log *slog.Logger) (net.Addr, func(context.Context), error) {
	ta, err := net.ResolveTCPAddr("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("pprof: %w", err)
	}
	if !ta.IP.IsLoopback() {
		return nil, nil, fmt.Errorf("pprof: %s is not a loopback address", addr)
	}
	ln, err := net.ListenTCP("tcp", ta)
	if err != nil {
		return nil, nil, fmt.Errorf("pprof: %w", err)
	}
	// No /debug/pprof/cmdline: the command line may carry --token or
	// --jwt-secret.
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: loopbackOnly(mux), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("pprof", "err", err)
		}
	}()
	log.Info("pprof listening", "addr", ln.Addr().String())
	return ln.Addr(), func(ctx context.Context) {
		_ = srv.Shutdown(ctx)
		_ = srv.Close()
		<-done
	}, nil
}

// loopbackOnly refuses a request whose Host is not a loopback name: a
// page in a browser whose DNS name was rebound to 127.0.0.1 reaches the
// listener too, and would read the profiles as its own origin's.
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !gateway.LoopbackHost(r.Host) {
			http.Error(w, gateway.CodeHostNotAllowed+": the profiles answer only to a loopback host name", http.StatusMisdirectedRequest)
			return
		}
		h.ServeHTTP(w, r)
	})
}
