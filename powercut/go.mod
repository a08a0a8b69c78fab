module github.com/idemkit/idem/powercut

go 1.26

require golang.org/x/sys v0.28.0

require (
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/mattn/go-sqlite3 v1.14.53
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/google/uuid v1.6.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/hashicorp/go-retryablehttp v0.7.8 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)

// The root module is this repository's own: build against it as it is.
replace github.com/idemkit/idem => ../
