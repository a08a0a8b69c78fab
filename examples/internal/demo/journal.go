package demo

import (
	"fmt"
	"os"
	"path/filepath"
)

// JournalPath is where a demo keeps its journal: the file name in the
// demo's temporary directory tmp, which goes when the demo ends, or the
// path its -journal flag names (flag), kept for the operator CLI. A demo
// starts from an empty journal, so a flag naming a file that exists is an
// error.
func JournalPath(tmp, name, flag string) (string, error) {
	if flag == "" {
		return filepath.Join(tmp, name), nil
	}
	if _, err := os.Stat(flag); err == nil {
		return "", fmt.Errorf("journal %s already exists: the demo starts from an empty journal; name a new file", flag)
	}
	return flag, nil
}
