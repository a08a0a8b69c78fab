//go:build !unix

package sqlitefile

import "os"

// canReadWrite checks that this process may read and write the file at
// path. Without POSIX locks (see access_unix.go) opening it is harmless.
func canReadWrite(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return f.Close()
}
