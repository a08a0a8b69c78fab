package sqlitefile

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// tempPrefix begins the name under which create builds a new file. Such a
// name is never opened as a database once the file is linked to its path
// (see create), so it is not counted among the file's names.
const tempPrefix = ".idem-new-"

// checkNames refuses the file at db.path, whose Stat is fi, if it has
// another name (a hard link) than db.path. SQLite keeps the -wal and -shm
// beside the name it opens: processes opening one file by two names keep
// two WALs, each missing what the other's commits hold, and a checkpoint
// from one can overwrite pages the other's WAL still reads (SQLite's "How
// To Corrupt An SQLite Database File", "Multiple links to the same
// file"). A symbolic link is no other name: resolve followed it to
// db.path. Names in the same directory are looked for, so that the
// message can say which they are; one beginning with tempPrefix is a
// creator's (see create) and does not count. A link made after this check
// is not seen: this refuses the mistake when it is made, not a race with
// it.
//
// A creator removes its temporary name right after it links the file (see
// create), perhaps between the Stat and the look through the directory:
// the count is then taken again from a new Stat, until the two agree.
func (db *DB) checkNames(fi fs.FileInfo) error {
	for try := 0; ; try++ {
		n, others, wals, listed := db.names(fi)
		if n <= 1 {
			return nil
		}
		again, err := os.Stat(db.path)
		if err == nil && os.SameFile(fi, again) && linkCount(again) != linkCount(fi) && try < 100 {
			fi = again
			continue
		}
		return db.namesError(n, others, wals, listed)
	}
}

// names counts the file's names, less the creators' (tempPrefix), and
// lists its others in its directory and those of them with a WAL beside;
// listed is false when the directory could not be read (a directory the
// process may write but not list), where none is told apart.
func (db *DB) names(fi fs.FileInfo) (n uint64, others, wals []string, listed bool) {
	n = linkCount(fi)
	if n <= 1 {
		return n, nil, nil, true
	}
	dir := filepath.Dir(db.path)
	des, err := os.ReadDir(dir)
	listed = err == nil
	for _, de := range des {
		p := filepath.Join(dir, de.Name())
		if p == db.path || !de.Type().IsRegular() {
			continue
		}
		if ofi, err := os.Lstat(p); err != nil || !os.SameFile(fi, ofi) {
			continue
		}
		if strings.HasPrefix(de.Name(), tempPrefix) {
			n = max(n, 2) - 1
			continue
		}
		others = append(others, de.Name())
		if nonEmpty(p + "-wal") {
			wals = append(wals, de.Name())
		}
	}
	return n, others, wals, listed
}

func (db *DB) namesError(n uint64, others, wals []string, listed bool) error {
	dir := filepath.Dir(db.path)
	where := "none of the others beside it"
	switch {
	case !listed:
		// A creator killed between linking a new file and removing its
		// temporary name leaves that name (tempPrefix): not a name SQLite
		// opens, but only a listing tells it apart.
		where = fmt.Sprintf("which cannot be told apart, as this process may not list the directory %s (one may be a %s* name a creator killed while it built the file left, which is safe to remove)", dir, tempPrefix)
	case len(others) > 0:
		where = strings.Join(others, ", ") + " beside it"
		if uint64(len(others)) < n-1 {
			where += " and others elsewhere on its file system"
		}
	}
	hint := fmt.Sprintf("stop the processes using its other names, remove those names (find / -xdev -samefile %s lists them all) and open it by one name only; a symbolic link to it is fine", db.path)
	for _, o := range wals {
		hint += fmt.Sprintf("; first let %s-wal, which holds commits, reach the file: sqlite3 %s 'PRAGMA wal_checkpoint(TRUNCATE)'",
			o, filepath.Join(dir, o))
	}
	return &Error{What: db.what, Path: db.path, Kind: ErrHardLinks,
		Err:  fmt.Errorf("it has %d names (hard links), %s: SQLite keeps the -wal and -shm beside the name a process opens, so processes using different names would not see each other's commits, and a checkpoint could corrupt the file", n, where),
		Hint: hint}
}
