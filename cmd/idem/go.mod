module github.com/idemkit/idem/cmd/idem

go 1.26

require (
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/idemkit/idem/postgres v0.0.0-00010101000000-000000000000
	github.com/jackc/pgx/v5 v5.12.0
	github.com/mattn/go-sqlite3 v1.14.53
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/hashicorp/go-retryablehttp v0.7.8 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sync v0.22.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)

// No replace directives: `go install github.com/idemkit/idem/cmd/idem@VERSION`
// refuses a module that has them. In a clone, go.work beside this file
// builds the command against the root and postgres modules of the same
// checkout (go mod tidy ignores it: run it as
// `go mod edit -replace=github.com/idemkit/idem=../.. -replace=github.com/idemkit/idem/postgres=../../postgres && go mod tidy && go mod edit -dropreplace=github.com/idemkit/idem -dropreplace=github.com/idemkit/idem/postgres`).
// scripts/release sets the two versions above when a version is tagged.
