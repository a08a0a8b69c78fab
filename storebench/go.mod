module github.com/idemkit/idem/storebench

go 1.26.0

// This repository's own modules, as they are.
replace (
	github.com/idemkit/idem => ../
	github.com/idemkit/idem/postgres => ../postgres
	github.com/idemkit/idem/redis => ../redis
)

require (
	github.com/idemkit/idem v0.0.0
	github.com/idemkit/idem/postgres v0.0.0
	github.com/idemkit/idem/redis v0.0.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/hashicorp/go-retryablehttp v0.7.8 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/mattn/go-sqlite3 v1.14.53 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
