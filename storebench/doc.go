// Package storebench holds no code: its benchmark puts the middleware on
// every server store in one run (memory, SQLite, PostgreSQL, Redis), so
// that their figures are ratios against the same baseline under the same
// load. It is a module of its own so that neither the postgres module nor
// the redis module requires the other's client (pgx, go-redis) of its
// users.
package storebench
