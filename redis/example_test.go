package redis_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/redis"
	"github.com/idemkit/idem/server"
)

// An API's replicas share their keys in Redis: the application builds the
// client (goredis.NewClusterClient for a Cluster, NewFailoverClient for
// Sentinel), opens the store on it, and hands the store to the middleware.
// It runs against a Redis at 127.0.0.1:6379.
func Example() {
	ctx := context.Background()
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()

	// Open logs one line saying what a crash of this Redis can cost;
	// redis.RequireDurable() would refuse one without appendfsync always.
	store, err := redis.Open(ctx, client,
		redis.Prefix("example:"+fmt.Sprint(os.Getpid())+":"),
		redis.Logger(slog.New(slog.DiscardHandler)))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()
	mw, err := server.New(server.Config{Store: store, Scope: server.SingleTenant})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mw.Close()
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, `{"order":"ord_1"}`)
	})))
	defer srv.Close()

	for range 2 {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/orders", strings.NewReader(`{"item":"book"}`))
		req.Header.Set("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true")
	}
	client.Del(ctx, redis.Key(store.Prefix(), "", "8e03978e-40d5-43e8-bc93-6894a57f9324"))
	// Output:
	// 201 false
	// 201 true
}
