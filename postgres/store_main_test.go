package postgres_test

import (
	"testing"

	"github.com/idemkit/idem/postgres/internal/pgtest"
)

// Every test must leave no goroutine behind: stores hold none, middlewares
// are closed, test servers and their clients are closed, and the pools a
// test opens are closed with it. pgtest.Main closes the shared pool before
// it looks.
func TestMain(m *testing.M) {
	pgtest.Main(m)
}
