package idem

import (
	"bytes"
	"io"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
)

// readBody past its preallocation: a body of known size larger than
// preallocBytes is read whole through the growing buffer, however the
// reader hands it out, and one that ends short of its Content-Length,
// between two reads of the buffer, is io.ErrUnexpectedEOF, never a
// complete body.
func TestReadBodyOfAnnouncedSizeGrowsAsBytesArrive(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789abcdef"), (3*preallocBytes+100)/16)
	size := int64(len(body))
	for name, r := range map[string]func([]byte) io.Reader{
		"whole": func(b []byte) io.Reader { return bytes.NewReader(b) },
		"half":  func(b []byte) io.Reader { return iotest.HalfReader(bytes.NewReader(b)) },
	} {
		got, cut, err := readBody(r(body), 10*size, size)
		assert.NoError(t, err, name)
		assert.False(t, cut, name)
		assert.Equal(t, body, got, name)

		// Ending inside a read, and at the end of one (the next read
		// gets nothing: io.EOF from io.ReadFull).
		for _, n := range []int{2*preallocBytes + 7, 2 * preallocBytes} {
			short := body[:n]
			got, cut, err = readBody(r(short), 10*size, size)
			assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "%s, %d bytes", name, n)
			assert.False(t, cut, name)
			assert.Equal(t, short, got, name)
		}
	}
	got, _, err := readBody(bytes.NewReader(nil), 10*size, size)
	assert.NoError(t, err, "no body at all, as a HEAD's answer")
	assert.Empty(t, got)
}
