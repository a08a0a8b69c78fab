package probe

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"strconv"
)

// otherBody derives another valid request from a JSON body: its first
// numeric leaf incremented, else its first string leaf with "-2" appended.
// It says why when it cannot.
func otherBody(body []byte) ([]byte, error) {
	if !json.Valid(body) {
		return nil, errors.New("the body is not JSON, so no other body can be derived; give one (Config.OtherBody, idem probe --other-body)")
	}
	if b, ok := replaceLeaf(body, true); ok {
		return b, nil
	}
	if b, ok := replaceLeaf(body, false); ok {
		return b, nil
	}
	return nil, errors.New("the JSON body has no number or string value to change; give another body (Config.OtherBody, idem probe --other-body)")
}

// replaceLeaf replaces the first number value (numbers true) or string
// value (numbers false) of a valid JSON document; object keys are not
// values.
func replaceLeaf(body []byte, numbers bool) ([]byte, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	// stack holds, per open container, whether it is an object whose next
	// string is a key.
	type level struct{ object, wantKey bool }
	var stack []level
	for {
		before := dec.InputOffset()
		tok, err := dec.Token()
		if err == io.EOF || err != nil {
			return nil, false
		}
		end := dec.InputOffset()
		isKey := false
		if n := len(stack); n > 0 && stack[n-1].object {
			isKey = stack[n-1].wantKey
			if _, closing := tok.(json.Delim); !closing || tok != json.Delim('}') {
				stack[n-1].wantKey = !stack[n-1].wantKey
			}
		}
		start := before
		for start < end && bytes.IndexByte([]byte(" \t\r\n,:"), body[start]) >= 0 {
			start++
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				stack = append(stack, level{object: true, wantKey: true})
			case '[':
				stack = append(stack, level{})
			default:
				stack = stack[:len(stack)-1]
			}
		case json.Number:
			if numbers {
				return splice(body, start, end, []byte(increment(v))), true
			}
		case string:
			if !numbers && !isKey {
				lit, _ := json.Marshal(v + "-2")
				return splice(body, start, end, lit), true
			}
		}
	}
}

func splice(b []byte, start, end int64, with []byte) []byte {
	out := append([]byte(nil), b[:start]...)
	out = append(out, with...)
	return append(out, b[end:]...)
}

// increment adds one to a JSON number, keeping integers integers.
func increment(n json.Number) string {
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil && i < 1<<62 {
		return strconv.FormatInt(i+1, 10)
	}
	f, _, err := big.ParseFloat(string(n), 10, 200, big.ToNearestEven)
	if err != nil {
		return string(n) + "1"
	}
	return f.Add(f, big.NewFloat(1)).Text('g', -1)
}
