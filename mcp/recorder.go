package mcp

import (
	"bytes"
	"net/http"
)

// recorder is the http.ResponseWriter a tool call is served into: the
// server package's middleware, which keeps the promise for HTTP requests,
// keeps it for tool calls by serving each as an in-process request.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}
