package probe

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOtherBodyChangesTheFirstLeafAndStaysValid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{`{"item":"book","quantity":1}`, `{"item":"book","quantity":2}`},
		{`{"amount": 1999, "n": 5}`, `{"amount": 2000, "n": 5}`},
		{`{"a":{"b":[true,null,2.5]},"c":1}`, `{"a":{"b":[true,null,3.5]},"c":1}`},
		{`{"price":1e3}`, `{"price":1001}`},
		{`{"quantity":-1}`, `{"quantity":0}`},
		{`[ 7 ]`, `[ 8 ]`},
		{`{"1":"x"}`, `{"1":"x-2"}`},                                 // a numeric-looking key is a key
		{`{"name":"a\"b","ok":true}`, `{"name":"a\"b-2","ok":true}`}, // escapes kept valid
		{`{"k":{"inner":"v"},"z":"w"}`, `{"k":{"inner":"v-2"},"z":"w"}`},
		{`"just a string"`, `"just a string-2"`},
	} {
		got, err := otherBody([]byte(tc.in))
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.want, string(got), tc.in)
		require.True(t, json.Valid(got), tc.in)
	}
	for _, in := range []string{`item=book`, `{"ok":true,"x":null}`, `[]`, ``} {
		_, err := otherBody([]byte(in))
		require.Error(t, err, in)
	}
}
