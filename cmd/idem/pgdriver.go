package main

// The command links the PostgreSQL journal: it opens both kinds.
import _ "github.com/idemkit/idem/postgres"
