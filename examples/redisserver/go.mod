module github.com/idemkit/idem/examples/redisserver

go 1.26.0

require (
	github.com/idemkit/idem v0.0.0
	github.com/idemkit/idem/redis v0.0.0
	github.com/mattn/go-sqlite3 v1.14.53
	github.com/redis/go-redis/v9 v9.23.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

// This repository's own modules, as they are.
replace (
	github.com/idemkit/idem => ../../
	github.com/idemkit/idem/redis => ../../redis
)
