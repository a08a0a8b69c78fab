module github.com/idemkit/idem/powercut

go 1.26

require golang.org/x/sys v0.28.0

require (
	github.com/hanwen/go-fuse/v2 v2.12.1
	github.com/stretchr/testify v1.12.1
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect

// The root module is this repository's own: build against it as it is.
replace github.com/idemkit/idem => ../
