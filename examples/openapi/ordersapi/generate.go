// Package ordersapi is the client oapi-codegen generates from
// openapi.yaml, the OpenAPI document of examples/server's orders API. It
// is committed as generated; regenerate it with go generate.
package ordersapi

//go:generate go run github.com/oapi-codegen/oapi-codegen/v2/cmd/oapi-codegen@v2.8.2 -config config.yaml openapi.yaml
