module github.com/idemkit/idem

go 1.26

require (
	github.com/mattn/go-sqlite3 v1.14.53
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/google/uuid v1.6.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
