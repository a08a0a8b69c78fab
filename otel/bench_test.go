package otel_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/idemkit/idem"
	idemotel "github.com/idemkit/idem/otel"
)

// discard is an exporter that drops what it is given: the SDK's work up to
// export is measured, not an exporter's.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// BenchmarkDo measures what the otel hooks cost a Do, on a MemoryJournal
// at one caller against a loopback server (as the root's BenchmarkHooks):
// no hooks; ClientHooks on OpenTelemetry's no-op providers (an application
// that links the module but has not set up the SDK); and ClientHooks on the
// SDK (every span sampled and handed to a synchronous exporter that drops
// it, metrics aggregated by a manual reader), with the W3C propagator.
//
//	go test -run '^$' -bench 'BenchmarkDo$' -benchmem -count 5 .
func BenchmarkDo(b *testing.B) {
	body := []byte(`{"order_id":"ord_123","status":"created"}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}))
	defer srv.Close()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(discard{}))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	}()
	w3c := idemotel.WithPropagator(propagation.TraceContext{})
	payload := bytes.Repeat([]byte("x"), 200)
	for _, tc := range []struct {
		name  string
		hooks idem.Hooks
	}{
		{"none", idem.Hooks{}},
		{"otel-noop", idemotel.ClientHooks(idemotel.WithTracerProvider(tracenoop.NewTracerProvider()),
			idemotel.WithMeterProvider(noop.NewMeterProvider()), w3c)},
		{"otel-sdk", idemotel.ClientHooks(idemotel.WithTracerProvider(tp), idemotel.WithMeterProvider(mp), w3c)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tr := &http.Transport{MaxIdleConnsPerHost: 16}
			defer tr.CloseIdleConnections()
			c, err := idem.New(idem.Config{Journal: idem.NewMemoryJournal(), BaseURL: srv.URL,
				HTTPClient: &http.Client{Transport: tr}, Hooks: tc.hooks})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			b.ReportAllocs()
			var i int
			for b.Loop() {
				i++
				if _, err := c.Do(context.Background(), idem.Op{ID: fmt.Sprint("checkout/cart-", i), URL: "/orders", Body: payload}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
