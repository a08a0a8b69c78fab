// Package postgres keeps idem's journal and the server middleware's keys
// in PostgreSQL, for fleets that outgrow one machine: the workers of a
// fleet share one journal and take over each other's operations, and the
// replicas of an API share one store of keys.
//
// It is a module of its own, so that an application on the embedded SQLite
// journal never downloads a PostgreSQL driver. It is built on
// github.com/jackc/pgx/v5: the application opens a *pgxpool.Pool and
// passes it in.
package postgres
