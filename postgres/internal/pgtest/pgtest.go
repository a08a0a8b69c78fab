// Package pgtest connects the module's tests to a real PostgreSQL server
// and gives each test a schema of its own, so that tests run in parallel
// and leave nothing behind.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultDSN is the server every machine of this project runs; IDEM_TEST_POSTGRES
// names another.
const DefaultDSN = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// DSN returns the server the tests use.
func DSN() string {
	if dsn := os.Getenv("IDEM_TEST_POSTGRES"); dsn != "" {
		return dsn
	}
	return DefaultDSN
}

var (
	poolOnce sync.Once
	pool     *pgxpool.Pool
	poolErr  error
)

// Pool returns the pool the tests share, or fails the test with what to do
// when the server cannot be reached. The pool lives as long as the test
// binary.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	poolOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		cfg, err := pgxpool.ParseConfig(DSN())
		if err != nil {
			poolErr = err
			return
		}
		cfg.MaxConns = 32
		pool, poolErr = pgxpool.NewWithConfig(ctx, cfg)
		if poolErr == nil {
			poolErr = pool.Ping(ctx)
		}
	})
	if poolErr != nil {
		t.Fatalf("PostgreSQL at %s cannot be reached: %v\n"+
			"start it (pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start) or set IDEM_TEST_POSTGRES to a DSN", DSN(), poolErr)
	}
	return pool
}

// Schema returns the name of a new, empty schema for one test, dropped with
// everything in it when the test ends.
func Schema(t testing.TB) string {
	t.Helper()
	p := Pool(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "idem_test_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := p.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", name, err)
		}
	})
	return name
}
