// Package orders is the small orders application that idem's examples and
// tests run behind the server middleware: POST /orders creates an order in
// its own SQLite table, keyed by the request's idempotency key under a
// UNIQUE (tenant, key) constraint, the application's own guard against a
// handler that runs twice for one key.
package orders

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/mattn/go-sqlite3"

	"github.com/idemkit/idem/internal/sqlitefile"
	"github.com/idemkit/idem/internal/wire"
	"github.com/idemkit/idem/server"
)

// appID marks a file as an orders database ("idor").
const appID = 0x69646f72

var schema = []string{
	`CREATE TABLE orders (
		id       INTEGER PRIMARY KEY,
		tenant   TEXT NOT NULL,
		idem_key TEXT NOT NULL,
		item     TEXT NOT NULL,
		quantity INT NOT NULL,
		UNIQUE (tenant, idem_key)
	)`,
}

// TenantHeader names the caller's tenant; requests without it belong to
// DefaultTenant. A real service takes the tenant from the credential.
const (
	TenantHeader  = "X-Tenant"
	DefaultTenant = "default"
)

// Tenant returns the request's tenant. Use it as the middleware's Scope.
func Tenant(r *http.Request) string {
	if t := r.Header.Get(TenantHeader); t != "" {
		return t
	}
	return DefaultTenant
}

// Limits of an order.
const (
	MaxItemLength = 200
	MaxQuantity   = 1000
)

// ProblemInvalidOrder is the problem type of a request body that is not a
// valid order.
const ProblemInvalidOrder = "urn:idem:orders:invalid-order"

// Order is a created order as the API returns it.
type Order struct {
	ID       string `json:"order_id"`
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

// App is the orders application. It is safe for concurrent use.
type App struct {
	db         *sqlitefile.DB
	executions atomic.Int64
	guarded    atomic.Int64
}

// New opens (or creates) the orders database at dbPath.
func New(dbPath string) (*App, error) {
	db, err := sqlitefile.Open(context.Background(), dbPath, sqlitefile.Options{
		What: "orders database", AppID: appID, Migrations: schema,
	})
	if err != nil {
		return nil, err
	}
	return &App{db: db}, nil
}

// Close closes the database.
func (a *App) Close() error { return a.db.Close() }

// Handler is the business handler of POST /orders. It expects to run behind
// the server middleware, which puts the key in the request context.
func (a *App) Handler() http.Handler { return http.HandlerFunc(a.create) }

// Mux builds the full API: POST /orders behind mw, and the status endpoint
// GET /idempotency/{key}.
func Mux(app *App, mw *server.Middleware) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("POST /orders", mw.Handler(app.Handler()))
	mux.Handle("GET /idempotency/{key}", mw.StatusHandler())
	return mux
}

func (a *App) create(w http.ResponseWriter, r *http.Request) {
	a.executions.Add(1)
	var in struct {
		Item     *string `json:"item"`
		Quantity *int    `json:"quantity"`
	}
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		invalid(w, "The body must be a JSON object {\"item\":string,\"quantity\":int}: "+err.Error())
		return
	}
	if dec.More() {
		invalid(w, "The body must hold one JSON object only.")
		return
	}
	switch {
	case in.Item == nil || *in.Item == "":
		invalid(w, "item is required.")
		return
	case len(*in.Item) > MaxItemLength:
		invalid(w, fmt.Sprintf("item is longer than %d bytes.", MaxItemLength))
		return
	case in.Quantity == nil || *in.Quantity < 1 || *in.Quantity > MaxQuantity:
		invalid(w, fmt.Sprintf("quantity must be an integer from 1 to %d.", MaxQuantity))
		return
	}
	key, ok := server.KeyFromContext(r.Context())
	if !ok {
		problem(w, wire.Problem{Status: http.StatusInternalServerError,
			Detail: "The orders handler runs without the idempotency middleware in front of it."})
		return
	}
	order, dup, err := a.insert(r.Context(), Tenant(r), key, *in.Item, *in.Quantity)
	if err != nil {
		problem(w, wire.Problem{Status: http.StatusInternalServerError, Detail: "The order could not be saved."})
		return
	}
	if dup {
		a.guarded.Add(1)
	}
	body, _ := json.Marshal(order)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/orders/"+order.ID)
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

// insert creates the order, or, when the tenant's key already has one (a
// re-execution), returns that one with dup set.
func (a *App) insert(ctx context.Context, tenant, key, item string, quantity int) (o Order, dup bool, err error) {
	err = a.db.Write(ctx, sqlitefile.Durable, func(tx *sqlitefile.Tx) error {
		res, err := tx.Exec(`INSERT INTO orders (tenant, idem_key, item, quantity) VALUES (?, ?, ?, ?)`, tenant, key, item, quantity)
		var se sqlite3.Error
		if errors.As(err, &se) && se.ExtendedCode == sqlite3.ErrConstraintUnique {
			var id int64
			if err := tx.QueryRow(`SELECT id, item, quantity FROM orders WHERE tenant = ? AND idem_key = ?`, tenant, key).
				Scan(&id, &o.Item, &o.Quantity); err != nil {
				return err
			}
			o.ID, dup = orderID(id), true
			return nil
		}
		if err != nil {
			return err
		}
		id, err := res.LastInsertId()
		if err != nil {
			return err
		}
		o, dup = Order{ID: orderID(id), Item: item, Quantity: quantity}, false
		return nil
	})
	return o, dup, err
}

func orderID(id int64) string { return "ord_" + strconv.FormatInt(id, 10) }

func invalid(w http.ResponseWriter, detail string) {
	problem(w, wire.Problem{Type: ProblemInvalidOrder, Status: http.StatusBadRequest, Title: "Invalid order", Detail: detail})
}

func problem(w http.ResponseWriter, p wire.Problem) {
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	body, _ := json.Marshal(p)
	w.Header().Set("Content-Type", wire.ProblemContentType)
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// Orders returns how many orders tenant has.
func (a *App) Orders(ctx context.Context, tenant string) (int, error) {
	return a.count(ctx, `SELECT count(*) FROM orders WHERE tenant = ?`, tenant)
}

// TotalOrders returns how many orders there are.
func (a *App) TotalOrders(ctx context.Context) (int, error) {
	return a.count(ctx, `SELECT count(*) FROM orders`)
}

func (a *App) count(ctx context.Context, query string, args ...any) (int, error) {
	if err := a.db.ErrIfClosed(); err != nil {
		return 0, err
	}
	var n int
	err := a.db.Reader.QueryRowContext(ctx, query, args...).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	return n, err
}

// Executions returns how many times the handler ran since New.
func (a *App) Executions() int { return int(a.executions.Load()) }

// GuardedDuplicates returns how many runs since New found their key's order
// already there and answered with it instead of creating another.
func (a *App) GuardedDuplicates() int { return int(a.guarded.Load()) }
