module github.com/idemkit/idem/examples/stripe

go 1.26

require (
	github.com/idemkit/idem v0.0.0
	github.com/stripe/stripe-go/v82 v82.5.1
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/hashicorp/go-retryablehttp v0.7.8 // indirect
	github.com/mattn/go-sqlite3 v1.14.53 // indirect
)

// This repository's own modules, as they are.
replace github.com/idemkit/idem => ../../
