package wire

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// EncodeHeader is how journals and stores keep a header: the JSON object
// json.Marshal writes for it, byte for byte (names sorted, values as
// arrays of strings, HTML-safe escapes), nil for an empty header.
//
// JSON strings hold UTF-8 only: json.Marshal writes U+FFFD for each byte
// that is not, and HTTP allows such bytes in a value (obs-text: a
// Content-Disposition with a Latin-1 file name). A header with a name or
// value that is not valid UTF-8 is kept in a binary form instead (see
// binaryHeader), marked by a first byte that no JSON text starts with, so
// that every header stored before reads as it did and the rest read back
// byte for byte.
//
// It writes that JSON itself rather than through json.Marshal, which walks
// the map by reflection at about a dozen allocations a header; journals
// encode one or two headers in every write, on the goroutine that commits
// everyone's writes. Being the same bytes matters: a header set is stored
// once and found again by its encoding.
func EncodeHeader(h http.Header) []byte {
	if len(h) == 0 {
		return nil
	}
	names := make([]string, 0, len(h))
	size := 2
	text := true
	for name, values := range h {
		names = append(names, name)
		size += len(name) + 5
		text = text && utf8.ValidString(name)
		for _, v := range values {
			size += len(v) + 3
			text = text && utf8.ValidString(v)
		}
	}
	slices.Sort(names)
	if !text {
		return encodeBinaryHeader(h, names, size)
	}
	b := make([]byte, 0, size)
	b = append(b, '{')
	for i, name := range names {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, name)
		b = append(b, ':')
		values := h[name]
		if values == nil {
			b = append(b, "null"...)
			continue
		}
		b = append(b, '[')
		for j, v := range values {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendString(b, v)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

const hexDigits = "0123456789abcdef"

// appendString appends s as encoding/json writes a string with HTML
// escaping on (json.Marshal's default).
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// DecodeHeader reads what EncodeHeader wrote; nil or empty is no header.
// What EncodeHeader writes is read directly; anything else that is JSON
// (a header kept by an older version, say) goes through json.Unmarshal,
// and reads the same either way. The binary form reads back byte for
// byte.
func DecodeHeader(b []byte) (http.Header, error) {
	if len(b) == 0 {
		return nil, nil
	}
	if b[0] == binaryHeader {
		return decodeBinaryHeader(b[1:])
	}
	if h, ok := decodeHeader(b); ok {
		return h, nil
	}
	var h http.Header
	err := json.Unmarshal(b, &h)
	return h, err
}

// decodeHeader reads the JSON that EncodeHeader writes, without
// whitespace; ok is false for anything else, and the caller then parses
// it in full. Names and values without escapes are substrings of one copy
// of b, and every name's values share one array (each capped, as
// http.Header.Clone does, so that appending to one never overwrites the
// next): a handful of allocations whatever the header's size.
func decodeHeader(b []byte) (h http.Header, ok bool) {
	d := headerDecoder{b: b, s: string(b)}
	if !d.byte('{') {
		return nil, false
	}
	type field struct {
		name       string
		start, end int // in values
		null       bool
	}
	// Sized by bounds (every name ends with a colon, every value but the
	// last of each name with a comma), so that neither grows.
	fields := make([]field, 0, bytes.Count(b, []byte{':'}))
	values := make([]string, 0, bytes.Count(b, []byte{','})+1)
	if !d.byte('}') {
		for {
			name, ok := d.string()
			if !ok || !d.byte(':') {
				return nil, false
			}
			f := field{name: name, start: len(values)}
			switch {
			case d.null():
				f.null = true
			case d.byte('['):
				if !d.byte(']') {
					for {
						v, ok := d.string()
						if !ok {
							return nil, false
						}
						values = append(values, v)
						if d.byte(']') {
							break
						}
						if !d.byte(',') {
							return nil, false
						}
					}
				}
			default:
				return nil, false
			}
			f.end = len(values)
			fields = append(fields, f)
			if d.byte('}') {
				break
			}
			if !d.byte(',') {
				return nil, false
			}
		}
	}
	if d.i != len(b) {
		return nil, false
	}
	h = make(http.Header, len(fields))
	for _, f := range fields { // a name given twice: the last wins, as in json.Unmarshal
		switch {
		case f.null:
			h[f.name] = nil
		case f.start == f.end:
			h[f.name] = []string{}
		default:
			h[f.name] = values[f.start:f.end:f.end]
		}
	}
	return h, true
}

type headerDecoder struct {
	b []byte
	s string // b, copied once: unescaped strings are its substrings
	i int
}

func (d *headerDecoder) byte(c byte) bool {
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

func (d *headerDecoder) null() bool {
	if bytes.HasPrefix(d.b[d.i:], []byte("null")) {
		d.i += len("null")
		return true
	}
	return false
}

// string reads a JSON string. It gives up (ok false) on what it would have
// to judge as json.Unmarshal does: invalid UTF-8, and a \u escape of half
// a surrogate pair.
func (d *headerDecoder) string() (string, bool) {
	if !d.byte('"') {
		return "", false
	}
	start := d.i
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			s := d.s[start:d.i]
			d.i++
			return s, true
		case c == '\\':
			return d.escaped(start)
		case c < 0x20:
			return "", false
		case c < utf8.RuneSelf:
			d.i++
		default:
			r, size := utf8.DecodeRune(d.b[d.i:])
			if r == utf8.RuneError && size == 1 {
				return "", false
			}
			d.i += size
		}
	}
	return "", false
}

// escaped reads the rest of a string that has escapes, from start, its
// first byte after the quote.
func (d *headerDecoder) escaped(start int) (string, bool) {
	out := append([]byte(nil), d.b[start:d.i]...)
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return string(out), true
		case c == '\\':
			if d.i+1 >= len(d.b) {
				return "", false
			}
			e := d.b[d.i+1]
			d.i += 2
			switch e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				r, ok := d.hex4()
				if !ok || utf16.IsSurrogate(r) {
					return "", false
				}
				out = utf8.AppendRune(out, r)
			default:
				return "", false
			}
		case c < 0x20:
			return "", false
		case c < utf8.RuneSelf:
			out = append(out, c)
			d.i++
		default:
			r, size := utf8.DecodeRune(d.b[d.i:])
			if r == utf8.RuneError && size == 1 {
				return "", false
			}
			out = append(out, d.b[d.i:d.i+size]...)
			d.i += size
		}
	}
	return "", false
}

func (d *headerDecoder) hex4() (rune, bool) {
	if d.i+4 > len(d.b) {
		return 0, false
	}
	var r rune
	for _, c := range d.b[d.i : d.i+4] {
		switch {
		case '0' <= c && c <= '9':
			r = r<<4 | rune(c-'0')
		case 'a' <= c && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case 'A' <= c && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	d.i += 4
	return r, true
}

// binaryHeader marks the binary form of a header, EncodeHeader's for one
// that JSON cannot hold (a name or value that is not valid UTF-8). JSON
// text starts with '{', '[', '"', a digit, '-', a letter or whitespace,
// never with this byte. After it, for each name in sorted order: the
// name's length (uvarint) and bytes, then the count of its values plus
// one (uvarint; 0 for nil values, as null in the JSON form), then each
// value's length (uvarint) and bytes.
const binaryHeader = 0x01

func encodeBinaryHeader(h http.Header, sorted []string, size int) []byte {
	b := make([]byte, 0, 1+size)
	b = append(b, binaryHeader)
	for _, name := range sorted {
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		values := h[name]
		if values == nil {
			b = binary.AppendUvarint(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(values))+1)
		for _, v := range values {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	return b
}

// errBinaryHeader is a binary header cut short or with bytes past its end:
// the stored bytes are damaged.
var errBinaryHeader = errors.New("wire: a header kept in binary form is damaged (cut short or with trailing bytes)")

func decodeBinaryHeader(b []byte) (http.Header, error) {
	next := func() (uint64, bool) {
		n, size := binary.Uvarint(b)
		if size <= 0 {
			return 0, false
		}
		b = b[size:]
		return n, true
	}
	piece := func() (string, bool) {
		n, ok := next()
		if !ok || n > uint64(len(b)) {
			return "", false
		}
		s := string(b[:n])
		b = b[n:]
		return s, true
	}
	h := http.Header{}
	for len(b) > 0 {
		name, ok := piece()
		if !ok {
			return nil, errBinaryHeader
		}
		count, ok := next()
		// Each value takes a byte at least: a count past what is left is
		// damage, not an allocation to make.
		if !ok || count > uint64(len(b))+1 {
			return nil, errBinaryHeader
		}
		if count == 0 {
			h[name] = nil
			continue
		}
		values := make([]string, 0, count-1)
		for range count - 1 {
			v, ok := piece()
			if !ok {
				return nil, errBinaryHeader
			}
			values = append(values, v)
		}
		h[name] = values
	}
	return h, nil
}
