package mcp

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Canonical returns the canonical form of a tool call's arguments, by
// which two calls with one key are compared: the JSON value as
// encoding/json reads it (numbers kept as written, a repeated object
// member's last value), written back with no insignificant white space and
// every object's members sorted by name. So {"b": 1, "a": [true]} and
// {"a":[true],"b":1} are the same arguments, and 1 and 1.0 are not. Absent
// arguments are null.
func Canonical(args json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(args)) == 0 {
		return []byte("null"), nil
	}
	d := json.NewDecoder(bytes.NewReader(args))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("the arguments are not JSON: %w", err)
	}
	if d.More() {
		return nil, fmt.Errorf("the arguments hold more than one JSON value")
	}
	// encoding/json writes a map's members sorted by name, and a
	// json.Number as its text.
	var b bytes.Buffer
	e := json.NewEncoder(&b)
	e.SetEscapeHTML(false)
	if err := e.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
