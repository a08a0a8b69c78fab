package otel_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idemkit/idem"
	idemotel "github.com/idemkit/idem/otel"
	"github.com/idemkit/idem/server"
)

func ExampleClientHooks() {
	// The API: it answers 201 to every order.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	defer api.Close()

	// The application's OpenTelemetry SDK; here spans go to memory.
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())

	c, err := idem.New(idem.Config{
		Journal: idem.NewMemoryJournal(), // idem.OpenSQLite("ops.db", idem.SQLiteOnCommit(idemotel.JournalCommitHook()))
		BaseURL: api.URL,
		Hooks:   idemotel.ClientHooks(idemotel.WithTracerProvider(tp), idemotel.WithPropagator(propagation.TraceContext{})),
	})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	if _, err := c.Do(context.Background(), idem.Op{ID: "checkout/cart-42", URL: "/orders", Body: []byte(`{}`)}); err != nil {
		panic(err)
	}

	show := map[attribute.Key]bool{"idem.attempt": true, "idem.verdict": true, "http.response.status_code": true,
		"idem.state": true, "idem.attempts": true}
	for _, s := range spans.GetSpans() { // in the order they ended
		fmt.Print(s.Name)
		for _, kv := range s.Attributes {
			if show[kv.Key] {
				fmt.Printf(" %s=%s", kv.Key, kv.Value.Emit())
			}
		}
		fmt.Println()
	}
	// Output:
	// idem.attempt idem.attempt=1 idem.verdict=succeeded http.response.status_code=201
	// idem.do POST idem.attempts=1 idem.state=succeeded
}

func ExampleServerHooks() {
	// The application's OpenTelemetry SDK; metrics are read on demand.
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	mw, err := server.New(server.Config{
		Store:     server.NewMemoryStore(),
		Scope:     server.SingleTenant,
		OnOutcome: idemotel.ServerHooks(idemotel.WithMeterProvider(mp)),
	})
	if err != nil {
		panic(err)
	}
	defer mw.Close()
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	// The application's HTTP instrumentation (otelhttp.NewHandler, say)
	// runs each request in a server span, in front of the middleware.
	traced := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx, span := tp.Tracer("http").Start(r.Context(), r.Method+" /orders")
			defer span.End()
			next.ServeHTTP(w, r.WithContext(ctx))
		})
	}
	api := httptest.NewServer(traced(mw.Handler(orders)))
	defer api.Close()

	for range 2 { // the same key twice: the second is a replay
		req, _ := http.NewRequest(http.MethodPost, api.URL+"/orders", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "4b3c2a1d-0000-4000-8000-000000000042")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	for len(spans.GetSpans()) < 2 { // a span ends after its answer was sent
		time.Sleep(time.Millisecond)
	}

	for _, s := range spans.GetSpans() {
		for _, kv := range s.Attributes {
			if kv.Key == "idem.outcome" {
				fmt.Println(s.Name, kv.Key, kv.Value.Emit())
			}
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
			outcome, _ := dp.Attributes.Value("idem.outcome")
			fmt.Println(m.Name, outcome.Emit(), dp.Value)
		}
	}
	// Unordered output:
	// POST /orders idem.outcome ran
	// POST /orders idem.outcome replayed
	// idem.server.requests ran 1
	// idem.server.requests replayed 1
}

// An API that scopes keys by the caller's API key: the server's spans name
// the account the key belongs to, never the key.
func ExampleWithServerTenant() {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())

	// The application's own table of credentials.
	accounts := map[string]string{"Bearer sk_live_5521": "acme"}
	mw, err := server.New(server.Config{
		Store: server.NewMemoryStore(),
		Scope: func(r *http.Request) string { return r.Header.Get("Authorization") },
		OnOutcome: idemotel.ServerHooks(idemotel.WithServerTenant(func(scope string) string {
			return accounts[scope] // "" for an unknown credential: no attribute
		})),
	})
	if err != nil {
		panic(err)
	}
	defer mw.Close()
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	traced := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, span := tp.Tracer("http").Start(r.Context(), r.Method+" /orders")
		defer span.End()
		mw.Handler(orders).ServeHTTP(w, r.WithContext(ctx))
	})
	api := httptest.NewServer(traced)
	defer api.Close()

	req, _ := http.NewRequest(http.MethodPost, api.URL+"/orders", strings.NewReader(`{}`))
	req.Header.Set("Authorization", "Bearer sk_live_5521")
	req.Header.Set("Idempotency-Key", "4b3c2a1d-0000-4000-8000-000000000043")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	for len(spans.GetSpans()) < 1 {
		time.Sleep(time.Millisecond)
	}

	for _, kv := range spans.GetSpans()[0].Attributes {
		if kv.Key == "idem.operation.scope" || kv.Key == "idem.outcome" {
			fmt.Println(kv.Key, kv.Value.Emit())
		}
	}
	// Output:
	// idem.outcome ran
	// idem.operation.scope acme
}
