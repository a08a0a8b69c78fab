//go:build !unix

package sqlitefile

import "io/fs"

// linkCount is 1: os.Stat does not report a file's names here, and
// checkNames then checks nothing.
func linkCount(fs.FileInfo) uint64 { return 1 }
