module github.com/idemkit/idem/browser

go 1.26

// The root module is this repository's own: build against it as it is.
replace github.com/idemkit/idem => ../

require (
	github.com/chromedp/cdproto v0.159.0
	github.com/chromedp/chromedp v0.23.0
	github.com/idemkit/idem v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/go-json-experiment/json v0.0.0-20260213210345-44df1a37e875 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/hashicorp/go-retryablehttp v0.7.8 // indirect
	github.com/mattn/go-sqlite3 v1.14.53 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
