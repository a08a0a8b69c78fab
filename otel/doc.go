// Package otel traces and measures idem's client and server middleware with
// OpenTelemetry.
package otel
