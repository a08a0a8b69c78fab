// Package liveness tells a process whether another process that shares a
// file with it is still alive. Each live owner holds an exclusive advisory
// lock (flock) on a file of its own, in a directory beside the shared file;
// the kernel drops the lock when the process ends, however it ends (a
// SIGKILL included), so a lock that can be taken means its owner is gone.
//
// This works between processes of one machine, which is exactly who shares
// an SQLite file. Where advisory locks are not available, nobody is ever
// reported gone, and callers fall back on what they did without it (leases
// that lapse).
package liveness

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// ErrRegistered: the name was registered before; every registration needs
// a name of its own.
var ErrRegistered = errors.New("owner name already registered")

// Dir is a directory of owner lock files. It is safe for concurrent use.
type Dir struct {
	path string

	mu   sync.Mutex
	gone map[string]bool     // owners found gone: final, names are never reused
	mine map[string]*os.File // owners registered through this Dir, holding their lock
}

// New returns the directory at path; it is created (mode 0700) by the first
// Register.
func New(path string) *Dir {
	return &Dir{path: path, gone: map[string]bool{}, mine: map[string]*os.File{}}
}

// Path returns the directory's path.
func (d *Dir) Path() string { return d.path }

// fileOf is the lock file of owner: names may hold any character, so the
// file is named after a hash of the name, and holds the name itself.
func (d *Dir) fileOf(owner string) string {
	sum := sha256.Sum256([]byte(owner))
	return filepath.Join(d.path, hex.EncodeToString(sum[:16])+".lock")
}

// Register marks owner alive until release is called or the process ends.
// The lock is taken before the file gets its name, so that nobody ever
// sees the name of a live owner unlocked.
func (d *Dir) Register(owner string) (release func() error, err error) {
	if !supported {
		return func() error { return nil }, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mine[owner] != nil || d.gone[owner] {
		return nil, fmt.Errorf("%w: %q", ErrRegistered, owner)
	}
	if err := os.MkdirAll(d.path, 0o700); err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(d.path, ".new-*")
	if err != nil {
		return nil, err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // the link below gives the file its real name
	if err := lock(f, true); err != nil {
		f.Close()
		return nil, err
	}
	if _, err := f.WriteString(owner); err != nil {
		f.Close()
		return nil, err
	}
	if err := os.Link(tmp, d.fileOf(owner)); err != nil {
		f.Close()
		if errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("%w: %q", ErrRegistered, owner)
		}
		return nil, err
	}
	d.mine[owner] = f
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() {
			d.mu.Lock()
			defer d.mu.Unlock()
			delete(d.mine, owner)
			d.gone[owner] = true
			// Closing drops the lock: the file stays, so that others see
			// the owner gone and take its leases at once; Forget removes
			// it once nothing refers to the owner.
			err = f.Close()
		})
		return err
	}, nil
}

// Gone reports whether owner registered and is no longer alive. An owner
// that never registered here (or whose file was forgotten) is not known to
// be gone: the answer is false.
func (d *Dir) Gone(owner string) bool {
	if !supported || owner == "" {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.gone[owner] {
		return true
	}
	if d.mine[owner] != nil {
		return false
	}
	f, err := os.Open(d.fileOf(owner))
	if err != nil {
		return false
	}
	defer f.Close()
	if lock(f, false) != nil {
		return false // held: alive
	}
	d.gone[owner] = true
	return true
}

// Forget removes the file of owner if owner is gone, once the caller knows
// that nothing depends any more on owner being known gone.
func (d *Dir) Forget(owner string) {
	if !supported {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mine[owner] != nil {
		return
	}
	d.forgetLocked(d.fileOf(owner))
}

// forgetLocked removes the lock file at path if its lock can be taken,
// holding the lock while it does so.
func (d *Dir) forgetLocked(path string) {
	f, err := os.Open(path)
	if err != nil {
		return
	}
	defer f.Close()
	if lock(f, false) == nil {
		_ = os.Remove(path)
	}
}

// Sweep forgets every gone owner for which keep returns false: a process
// that died without anyone needing to take its leases leaves its file, and
// this removes it.
func (d *Dir) Sweep(keep func(owner string) bool) error {
	if !supported {
		return nil
	}
	entries, err := os.ReadDir(d.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".lock") {
			continue
		}
		path := filepath.Join(d.path, name)
		owner, err := os.ReadFile(path)
		if err != nil || !d.Gone(string(owner)) || keep(string(owner)) {
			continue
		}
		d.mu.Lock()
		d.forgetLocked(path)
		d.mu.Unlock()
	}
	return nil
}
