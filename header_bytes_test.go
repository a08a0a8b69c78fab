package idem_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// An endpoint answers with a header that is not UTF-8 (obs-text, which
// HTTP allows and net/http passes on as is: a Content-Disposition with a
// Latin-1 file name). Client.Do's doc: a success carries "the server's
// status, headers and body"; calling Do again "returns the journaled
// result", and calls for one operation "return the same result". The
// first Do returns the server's bytes; the second answers from the SQLite
// journal, whose header went through JSON: U+FFFD where the server sent
// 0xE9 (the PostgreSQL journal does the same,
// postgres/headers_bytes_test.go). journaltest has no such input.
func TestRepeatedDoGetsTheFirstAnswersHeadersByteForByte(t *testing.T) {
	t.Parallel()
	const value = "attachment; filename=\"caf\xe9.txt\""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Disposition", value)
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	j, err := idem.OpenSQLite(filepath.Join(t.TempDir(), "journal.db"))
	require.NoError(t, err)
	defer j.Close()
	c, err := idem.New(idem.Config{Journal: j, BaseURL: srv.URL})
	require.NoError(t, err)
	defer c.Close()
	op := idem.Op{ID: "file-1", Method: http.MethodPost, URL: "/files", Body: []byte(`{}`)}
	ctx := t.Context()
	first, err := c.Do(ctx, op)
	require.NoError(t, err)
	require.Equal(t, []byte(value), []byte(first.Header.Get("Content-Disposition")))
	again, err := c.Do(ctx, op)
	require.NoError(t, err)
	assert.Equal(t, []byte(value), []byte(again.Header.Get("Content-Disposition")), "the journaled result is the answer the first Do returned")
}
