package gateway

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"
	"strings"

	"github.com/valyala/fasthttp"
)

// uiFiles is the approvals page: plain files, no build step, so the binary
// alone serves it.
//
//go:embed ui
var uiFiles embed.FS

// uiAsset is one embedded file, ready to serve.
type uiAsset struct {
	body        []byte
	contentType string
	etag        string
}

// uiAssets maps the path under /ui/ ("" for the page itself) to its file.
// Built once: the files are compiled in and never change.
var uiAssets = loadUIAssets()

func loadUIAssets() map[string]uiAsset {
	out := map[string]uiAsset{}
	err := fs.WalkDir(uiFiles, "ui", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := uiFiles.ReadFile(p)
		if err != nil {
			return err
		}
		ct, ok := uiTypes[path.Ext(p)]
		if !ok {
			return fmt.Errorf("%s: no content type for its extension", p)
		}
		sum := sha256.Sum256(body)
		name := strings.TrimPrefix(p, "ui/")
		if name == "index.html" {
			name = ""
		}
		out[name] = uiAsset{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		panic("gateway: embedded ui: " + err.Error())
	}
	return out
}

// uiTypes are the content types of the page's files. A fixed table, not
// package mime: the host's /etc/mime.types may be missing or disagree, and
// with nosniff a browser refuses a script or stylesheet of the wrong type.
var uiTypes = map[string]string{
	".html":        "text/html; charset=utf-8",
	".js":          "text/javascript; charset=utf-8",
	".css":         "text/css; charset=utf-8",
	".webmanifest": "application/manifest+json",
	".png":         "image/png",
}

// uiCSP confines the page to its own origin: the token it holds can only
// be sent to this gateway, and no injected markup can run script. The
// manifest and the service worker of the installable app are its own
// files too.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; manifest-src 'self'; worker-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// serveUI serves the approvals page under /ui/ and reports whether the
// request was for it. The files need no authentication: they hold no data,
// and the page signs in to the API with a token the person pastes. p is
// the request's path, which serve has made a string already.
func (s *Server) serveUI(ctx *fasthttp.RequestCtx, p string) bool {
	if p != "/ui" && !strings.HasPrefix(p, "/ui/") {
		return false
	}
	if !ctx.IsGet() && !ctx.IsHead() {
		s.refuse(ctx, nil, noRoute(ctx, "GET, HEAD"))
		return true
	}
	if p == "/ui" {
		// Relative asset URLs in the page resolve against /ui/ only. The
		// Location is relative too, so that it survives a proxy that mounts
		// the gateway under a path prefix (fasthttp's Redirect would make it
		// absolute with the gateway's own host).
		ctx.Response.Header.Set("Location", "ui/")
		ctx.SetStatusCode(fasthttp.StatusMovedPermanently)
		return true
	}
	a, ok := uiAssets[strings.TrimPrefix(p, "/ui/")]
	if !ok {
		s.refuse(ctx, nil, noRoute(ctx, ""))
		return true
	}
	h := &ctx.Response.Header
	// no-cache, not a max-age: the files change with the binary and carry
	// no version in their names, so the browser revalidates by ETag.
	h.Set("Cache-Control", "no-cache")
	h.Set("ETag", a.etag)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", uiCSP)
	if string(ctx.Request.Header.Peek("If-None-Match")) == a.etag {
		ctx.SetStatusCode(fasthttp.StatusNotModified)
		return true
	}
	ctx.SetContentType(a.contentType)
	ctx.SetBody(a.body)
	return true
}
