package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Canonical returns the canonical form of a tool call's arguments, by
// which two calls with one key are compared: the JSON value as
// encoding/json reads it (numbers kept as written), written back with no
// insignificant white space and every object's members sorted by name.
// So {"b": 1, "a": [true]} and {"a":[true],"b":1} are the same arguments,
// and 1 and 1.0 are not. Absent arguments are null.
//
// Arguments that encoding/json reads as one value but a tool reading its
// raw arguments may read as another are refused: an object with a member
// named twice, two members whose names differ only in case (encoding/json
// matches a struct field's name without regard to case, the last member
// winning, so the order of the two is the value), bytes that are not
// UTF-8, a \u escape of half a surrogate pair. Each of them would compare
// equal to arguments that differ.
func Canonical(args json.RawMessage) ([]byte, error) {
	if len(bytes.TrimSpace(args)) == 0 {
		return []byte("null"), nil
	}
	if !utf8.Valid(args) {
		return nil, ambiguous(errors.New("they hold bytes that are not UTF-8"))
	}
	members, err := scan(args)
	if err != nil {
		return nil, ambiguous(err)
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
	// A member named twice is one map entry: fewer entries than names.
	if count(v) != members {
		return nil, ambiguous(errors.New("an object names a member twice"))
	}
	if a, b, ok := foldedTwice(v); ok {
		return nil, ambiguous(fmt.Errorf("an object has members %q and %q, names that differ only in case", a, b))
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

func ambiguous(err error) error {
	return fmt.Errorf("the arguments are ambiguous: %w; send each member once, under one spelling, as UTF-8", err)
}

// foldedTwice finds, in an object of v at any depth, two member names
// equal under Unicode case folding (strings.EqualFold).
func foldedTwice(v any) (a, b string, ok bool) {
	switch v := v.(type) {
	case map[string]any:
		if len(v) > 1 {
			seen := make(map[string]string, len(v))
			for name := range v {
				f := fold(name)
				if other, dup := seen[f]; dup {
					a, b = min(name, other), max(name, other)
					return a, b, true
				}
				seen[f] = name
			}
		}
		for _, e := range v {
			if a, b, ok := foldedTwice(e); ok {
				return a, b, true
			}
		}
	case []any:
		for _, e := range v {
			if a, b, ok := foldedTwice(e); ok {
				return a, b, true
			}
		}
	}
	return "", "", false
}

// fold maps each rune of s to the least rune of its case-folding orbit
// (unicode.SimpleFold), so that fold(s) == fold(t) exactly when
// strings.EqualFold(s, t): "K" (Kelvin), "K" and "k" are one.
func fold(s string) string {
	var b strings.Builder
	for _, r := range s {
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			m = min(m, f)
		}
		b.WriteRune(m)
	}
	return b.String()
}

// count is the number of object members in v, at every depth.
func count(v any) int {
	n := 0
	switch v := v.(type) {
	case map[string]any:
		n += len(v)
		for _, e := range v {
			n += count(e)
		}
	case []any:
		for _, e := range v {
			n += count(e)
		}
	}
	return n
}

// scan counts the object members in args (the colons outside strings),
// and reports a \u escape of half a surrogate pair, which encoding/json
// reads as U+FFFD whatever half it was. Syntax errors are left to the
// decoder.
func scan(args []byte) (members int, err error) {
	inString := false
	for i := 0; i < len(args); i++ {
		c := args[i]
		if !inString {
			switch c {
			case '"':
				inString = true
			case ':':
				members++
			}
			continue
		}
		switch c {
		case '"':
			inString = false
		case '\\':
			if i+1 < len(args) && args[i+1] == 'u' {
				r, ok := hex4(args[i+2:])
				switch {
				case !ok:
				case 0xDC00 <= r && r <= 0xDFFF:
					return 0, fmt.Errorf("a string holds \\u%04x, half a surrogate pair", r)
				case 0xD800 <= r && r <= 0xDBFF:
					lo, ok := uint16(0), false
					if i+7 < len(args) && args[i+6] == '\\' && args[i+7] == 'u' {
						lo, ok = hex4(args[i+8:])
					}
					if !ok || lo < 0xDC00 || lo > 0xDFFF {
						return 0, fmt.Errorf("a string holds \\u%04x, half a surrogate pair", r)
					}
					i += 6 // the low half, checked
				}
				i += 5
				continue
			}
			i++ // the escaped byte
		}
	}
	return members, nil
}

func hex4(b []byte) (uint16, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r uint16
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | uint16(c)
	}
	return r, true
}
