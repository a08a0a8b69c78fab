// Package orders is the application of the server example, and the
// server side of the idem pattern in full, on the public API only (package
// server, database/sql and the SQLite driver): copy it into a module of
// your own and replace the orders with your effect.
//
//   - POST /orders runs behind the middleware, which runs it once per
//     (tenant, key) and stores its response before sending it; the status
//     endpoint GET /idempotency/{key} sits beside it, behind the same
//     authentication (see Mux).
//   - The handler keeps the request's key (server.KeyFromContext) in its
//     own table, under a UNIQUE (tenant, idem_key) constraint, in the same
//     transaction as the order. This is the second guard: should the
//     handler ever run twice for one key (its process died after the order
//     was committed and before the response was stored, so the key's lock
//     went stale and the client's retry ran it again), the second run finds
//     the first run's order and answers with it instead of creating
//     another.
//
// The database is one SQLite file, created with mode 0600, in WAL mode
// with synchronous=FULL, so that an order is on disk before its response
// is stored and sent.
package orders

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	_ "github.com/mattn/go-sqlite3" // the database/sql driver "sqlite3"

	"github.com/idemkit/idem/server"
)

// appID marks a file as an orders database ("idor"), so that New never
// writes into another program's SQLite file.
const appID = 0x69646f72

const schema = `CREATE TABLE IF NOT EXISTS orders (
	id       INTEGER PRIMARY KEY,
	tenant   TEXT NOT NULL,
	idem_key TEXT NOT NULL,
	item     TEXT NOT NULL,
	quantity INT NOT NULL,
	UNIQUE (tenant, idem_key)
)`

// TenantHeader names the caller's tenant; requests without it belong to
// DefaultTenant. A real service takes the tenant from the credential its
// authentication checked, never from a header the caller chooses.
const (
	TenantHeader  = "X-Tenant"
	DefaultTenant = "default"
)

// Tenant returns the request's tenant. It is the middleware's Config.Scope:
// keys, replays and status answers never cross tenants.
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

// ErrNotOrdersDatabase: the file New was given belongs to another program.
var ErrNotOrdersDatabase = errors.New("not an orders database")

// Order is a created order as the API returns it.
type Order struct {
	ID       string `json:"order_id"`
	Item     string `json:"item"`
	Quantity int    `json:"quantity"`
}

// App is the orders application. It is safe for concurrent use.
type App struct {
	db         *sql.DB
	executions atomic.Int64
	guarded    atomic.Int64
}

// New opens the orders database at path, creating it (mode 0600) when it
// does not exist. It refuses a file of another program, changing nothing.
func New(path string) (*App, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	// SQLite would create the file with the process's umask (often 0644,
	// readable by every local user); its -wal and -shm files take the
	// database file's mode, so creating it 0600 here covers all three.
	// Only a missing file is opened here (O_EXCL): closing a descriptor of
	// a file that SQLite connections of this process hold would drop their
	// locks.
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	switch {
	case errors.Is(err, fs.ErrExist):
	case err != nil:
		return nil, fmt.Errorf("orders database %s: %w", abs, err)
	default:
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("orders database %s: %w", abs, err)
		}
	}
	q := url.Values{}
	q.Set("_synchronous", "FULL") // a commit is on disk when it returns
	q.Set("_busy_timeout", "10000")
	q.Set("_txlock", "immediate") // a transaction takes the write lock at BEGIN: no deadlock between two writers
	dsn := (&url.URL{Scheme: "file", Path: abs, RawQuery: q.Encode()}).String()
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, fmt.Errorf("orders database %s: %w", abs, err)
	}
	// One connection: this process's orders queue for it in database/sql,
	// in order, instead of racing for SQLite's write lock, whose busy
	// handler retries at intervals and lets a writer starve past its
	// timeout ("database is locked") under load. Other processes that
	// open the file still wait up to the busy timeout.
	db.SetMaxOpenConns(1)
	if err := setUp(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("orders database %s: %w", abs, err)
	}
	return &App{db: db}, nil
}

// setUp checks that the file is an orders database, or makes an empty one
// into one, and turns WAL on.
func setUp(db *sql.DB) error {
	tx, err := db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	var id, tables int
	if err := tx.QueryRow(`PRAGMA application_id`).Scan(&id); err != nil {
		return err
	}
	if err := tx.QueryRow(`SELECT count(*) FROM sqlite_master`).Scan(&tables); err != nil {
		return err
	}
	switch {
	case id == appID:
	case id == 0 && tables == 0:
		if _, err := tx.Exec(fmt.Sprintf(`PRAGMA application_id = %d`, appID)); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: the file belongs to another program; choose another path", ErrNotOrdersDatabase)
	}
	if _, err := tx.Exec(schema); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	// WAL lets the status endpoint and other readers work while an order
	// is written. It is a property of the file, set once it is known to be
	// ours.
	var mode string
	if err := db.QueryRow(`PRAGMA journal_mode = WAL`).Scan(&mode); err != nil {
		return err
	}
	if mode != "wal" {
		return fmt.Errorf("journal mode is %q, WAL could not be set", mode)
	}
	return nil
}

// Close closes the database.
func (a *App) Close() error { return a.db.Close() }

// Handler is the business handler of POST /orders. It expects to run behind
// the server middleware, which puts the key in the request context.
func (a *App) Handler() http.Handler { return http.HandlerFunc(a.create) }

// Mux builds the full API: POST /orders behind mw, and the status endpoint
// GET /idempotency/{key} beside it. Put the service's authentication in
// front of the whole mux, both routes alike: the status endpoint answers
// within the scope that mw's Config.Scope reads from the request, so it
// must see the same authenticated tenant as the route it reports on.
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
		writeProblem(w, problem{Status: http.StatusInternalServerError,
			Detail: "The orders handler runs without the idempotency middleware in front of it."})
		return
	}
	// r.Context() is canceled when the middleware can no longer hold the
	// key (context.Cause is server.ErrLockNotRenewed): the transaction
	// then rolls back, before another request may run this one again.
	order, dup, err := a.insert(r.Context(), Tenant(r), key, *in.Item, *in.Quantity)
	if err != nil {
		writeProblem(w, problem{Status: http.StatusInternalServerError, Detail: "The order could not be saved."})
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
// second run of the handler for the key), returns that one with dup set.
// The UNIQUE (tenant, idem_key) constraint decides, inside the transaction
// that creates the order: no window between looking and inserting.
func (a *App) insert(ctx context.Context, tenant, key, item string, quantity int) (o Order, dup bool, err error) {
	tx, err := a.db.BeginTx(ctx, nil)
	if err != nil {
		return Order{}, false, err
	}
	defer tx.Rollback() //nolint:errcheck // a no-op after Commit
	res, err := tx.ExecContext(ctx, `INSERT INTO orders (tenant, idem_key, item, quantity) VALUES (?, ?, ?, ?)
		ON CONFLICT (tenant, idem_key) DO NOTHING`, tenant, key, item, quantity)
	if err != nil {
		return Order{}, false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return Order{}, false, err
	}
	var id int64
	if n == 0 {
		dup = true
		err = tx.QueryRowContext(ctx, `SELECT id, item, quantity FROM orders WHERE tenant = ? AND idem_key = ?`, tenant, key).
			Scan(&id, &item, &quantity)
	} else {
		id, err = res.LastInsertId()
	}
	if err != nil {
		return Order{}, false, err
	}
	if err := tx.Commit(); err != nil {
		return Order{}, false, err
	}
	return Order{ID: orderID(id), Item: item, Quantity: quantity}, dup, nil
}

func orderID(id int64) string { return "ord_" + strconv.FormatInt(id, 10) }

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type,omitempty"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
}

func invalid(w http.ResponseWriter, detail string) {
	writeProblem(w, problem{Type: ProblemInvalidOrder, Status: http.StatusBadRequest, Title: "Invalid order", Detail: detail})
}

func writeProblem(w http.ResponseWriter, p problem) {
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	body, _ := json.Marshal(p)
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// Orders returns how many orders tenant has.
func (a *App) Orders(ctx context.Context, tenant string) (int, error) {
	var n int
	err := a.db.QueryRowContext(ctx, `SELECT count(*) FROM orders WHERE tenant = ?`, tenant).Scan(&n)
	return n, err
}

// TotalOrders returns how many orders there are.
func (a *App) TotalOrders(ctx context.Context) (int, error) {
	var n int
	err := a.db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(&n)
	return n, err
}

// Executions returns how many times the handler ran since New.
func (a *App) Executions() int { return int(a.executions.Load()) }

// GuardedDuplicates returns how many runs since New found their key's order
// already there and answered with it instead of creating another.
func (a *App) GuardedDuplicates() int { return int(a.guarded.Load()) }
