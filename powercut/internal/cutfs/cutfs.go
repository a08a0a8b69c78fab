// Package cutfs is a FUSE file system for tests that forgets, on a
// simulated power cut, everything that was not made durable, the way LazyFS,
// ALICE and CrashMonkey check what a program's fsyncs really guarantee.
//
// It passes through to a real directory, the backing directory, which holds
// exactly what is durable. What a program writes through the mount is held in
// memory until it is made durable:
//
//   - a file's writes and truncations since its last fsync or fdatasync (or
//     every write, for a file opened O_SYNC or O_DSYNC) are held in pages of
//     memory, read back by every reader of the mount, and written into the
//     backing file by the fsync;
//   - a directory's new entries (create, mkdir, link, symlink, rename's
//     target) and removed entries (unlink, rmdir, rename's source or a
//     replaced target) are made in the backing directory at once, but logged
//     with what it takes to undo them (a removed file is kept alive by a hard
//     link outside the backing directory) until the directory is fsynced: an
//     entry is durable once every directory it touches has been fsynced
//     since.
//
// Cut simulates the power cut: it unmounts (so the kernel's caches go as
// RAM would), drops every held write, undoes every entry not yet durable
// (latest first), optionally tears the last unsynced write at a 512-byte
// boundary (its first sectors reach the disk, the rest does not), and mounts
// again: the mount then shows only what was synced. Every process using the
// mount must be gone before Cut: a test SIGKILLs them first, as the power cut
// would.
//
// Locks (flock, POSIX record locks) are left to the kernel, which keeps
// them for the mount among the processes of this machine: the file system
// does not take part (no EnableLocks), and a cut drops them with the
// processes that held them. Shared writable mmap works through the kernel's
// page cache (the mount does not use direct I/O); what the kernel writes
// back from a mapping is held like any write, so SQLite's -shm file, which
// is never fsynced, is lost on a cut, as SQLite expects of a shared-memory
// index it rebuilds.
//
// Not modelled: metadata other than size and names (modes, times, owners
// reach the backing directory at once); a rename across directories is
// durable only once both directories are fsynced (undone whole otherwise);
// RENAME_EXCHANGE and O_TMPFILE are refused; reordering of unsynced writes
// other than the torn last one (a cut drops them all).
package cutfs

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// sectorSize is the unit of a torn write: a disk writes whole sectors.
const sectorSize = 512

// FS is a mounted power-cut file system. Its methods are safe for
// concurrent use.
type FS struct {
	mountpoint, backing, stash string

	mu     sync.Mutex
	server *fuse.Server
	files  map[uint64]*fileState
	// The log of entries not yet durable, oldest first, and the sequence
	// number each directory (by backing inode) was last fsynced at.
	log      []*entryOp
	seq      uint64
	dirSync  map[uint64]uint64
	dirFds   map[uint64]*os.File
	stashed  int
	last     *lastWrite // the last write, while its file is not synced since
	counters Counters
}

// Counters count what the file system did since it was mounted first.
type Counters struct {
	Cuts        int   // power cuts
	Fsyncs      int   // fsync and fdatasync of files
	DirFsyncs   int   // fsync of directories
	LostWrites  int64 // bytes of writes dropped by cuts
	LostFiles   int   // files that had writes dropped
	LostEntries int   // directory entries undone by cuts
	TornWrites  int   // cuts that tore a write
}

// Cut says what one power cut dropped.
type Cut struct {
	// Files had unsynced writes, Bytes of them, dropped.
	Files int
	Bytes int64
	// Entries were undone: names created, removed or renamed since their
	// directory's last fsync.
	Entries int
	// Torn is set when the last unsynced write was torn: TornKept of its
	// TornLen bytes, from offset TornOffset of TornPath (in the backing
	// directory, as named when written), reached the disk.
	Torn              bool
	TornPath          string
	TornOffset        int64
	TornKept, TornLen int
}

type lastWrite struct {
	s    *fileState
	path string
	off  int64
	data []byte
}

// Mount mounts a power-cut file system at mountpoint over backing, an
// existing directory, which holds what is durable; stash is a directory of
// its own, outside backing, where removed files are kept until a cut could
// need them back. mountpoint and stash are created if missing.
func Mount(mountpoint, backing, stash string) (*FS, error) {
	for _, d := range []string{mountpoint, stash} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	var err error
	f := &FS{}
	if f.mountpoint, err = filepath.Abs(mountpoint); err != nil {
		return nil, err
	}
	if f.backing, err = filepath.Abs(backing); err != nil {
		return nil, err
	}
	if f.stash, err = filepath.Abs(stash); err != nil {
		return nil, err
	}
	f.reset()
	if err := f.mount(); err != nil {
		return nil, err
	}
	return f, nil
}

// Usable reports why FUSE cannot be mounted here, or nil: /dev/fuse must
// open, and mounting needs CAP_SYS_ADMIN (there is no fusermount to fall
// back on).
func Usable() error {
	fd, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("cannot open /dev/fuse: %w", err)
	}
	fd.Close()
	dir, err := os.MkdirTemp("", "cutfs-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	f, err := Mount(filepath.Join(dir, "mnt"), dir, filepath.Join(dir, "stash"))
	if err != nil {
		return fmt.Errorf("cannot mount a FUSE file system: %w", err)
	}
	return f.Unmount()
}

func (f *FS) reset() {
	f.files = map[uint64]*fileState{}
	f.log = nil
	f.dirSync = map[uint64]uint64{}
	f.dirFds = map[uint64]*os.File{}
	f.last = nil
}

func (f *FS) mount() error {
	root := &fs.LoopbackRoot{Path: f.backing}
	var st syscall.Stat_t
	if err := syscall.Stat(f.backing, &st); err != nil {
		return err
	}
	root.Dev = uint64(st.Dev)
	rootNode := &node{LoopbackNode: &fs.LoopbackNode{RootData: root}, cfs: f}
	root.RootNode = rootNode
	timeout := time.Second
	opts := &fs.Options{
		EntryTimeout: &timeout,
		AttrTimeout:  &timeout,
		MountOptions: fuse.MountOptions{
			DirectMountStrict: true,
			FsName:            "cutfs:" + f.backing,
			Name:              "cutfs",
			// Reads and writes may run at once; the file system's lock
			// orders them.
			MaxBackground: 64,
		},
	}
	server, err := fs.Mount(f.mountpoint, rootNode, opts)
	if err != nil {
		return err
	}
	f.server = server
	return nil
}

// Dir returns the mount point.
func (f *FS) Dir() string { return f.mountpoint }

// Backing returns the backing directory: what is durable. Between a Cut and
// the next write through the mount it is exactly what the mount shows.
func (f *FS) Backing() string { return f.backing }

// Counters returns what the file system did so far.
func (f *FS) Counters() Counters {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counters
}

// Unmount syncs nothing: it drops what a cut would (without tearing) and
// unmounts for good.
func (f *FS) Unmount() error {
	if err := f.server.Unmount(); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, err := f.dropLocked(nil)
	return err
}

// Cut simulates a power cut: see the package documentation. Every process
// that had files open on the mount must have ended. With tear non-nil, the
// last write that was not synced since, if it spans more than one sector,
// is torn at a sector boundary drawn from tear.
func (f *FS) Cut(tear *rand.Rand) (Cut, error) {
	if err := f.server.Unmount(); err != nil {
		return Cut{}, fmt.Errorf("cut: unmount %s: %w (is a process still using it?)", f.mountpoint, err)
	}
	f.mu.Lock()
	c, err := f.dropLocked(tear)
	f.counters.Cuts++
	f.mu.Unlock()
	if err != nil {
		return c, err
	}
	return c, f.mount()
}

// dropLocked forgets everything not durable, with the mount gone.
func (f *FS) dropLocked(tear *rand.Rand) (Cut, error) {
	var c Cut
	var errs []error
	// Entries first, latest first: a file created since its directory's
	// fsync is gone whatever was written to it.
	for i := len(f.log) - 1; i >= 0; i-- {
		if err := f.log[i].undo(f); err != nil {
			errs = append(errs, fmt.Errorf("undo %s: %w", f.log[i].what, err))
		}
		c.Entries++
	}
	if tear != nil && f.last != nil {
		w := f.last
		first := (w.off/sectorSize + 1) * sectorSize // the first boundary inside the write
		end := w.off + int64(len(w.data))
		if first < end {
			n := (end - 1 - first) / sectorSize // boundaries after the first
			cut := first + tear.Int64N(n+1)*sectorSize
			kept := int(cut - w.off)
			if _, err := w.s.fd.WriteAt(w.data[:kept], w.off); err != nil {
				errs = append(errs, fmt.Errorf("tear: %w", err))
			}
			c.Torn, c.TornPath, c.TornOffset, c.TornKept, c.TornLen = true, w.path, w.off, kept, len(w.data)
			f.counters.TornWrites++
		}
	}
	for _, s := range f.files {
		if s.dirty {
			c.Files++
			c.Bytes += s.written
		}
		s.fd.Close()
	}
	for _, d := range f.dirFds {
		d.Close()
	}
	if err := os.RemoveAll(f.stash); err != nil {
		errs = append(errs, err)
	}
	if err := os.MkdirAll(f.stash, 0o700); err != nil {
		errs = append(errs, err)
	}
	f.counters.LostFiles += c.Files
	f.counters.LostWrites += c.Bytes
	f.counters.LostEntries += c.Entries
	f.reset()
	return c, errors.Join(errs...)
}

// state returns the state of the backing file at path (inode ino),
// opening it if need be. The caller takes a reference if it keeps it.
func (f *FS) state(ino uint64, path string) (*fileState, error) {
	if s := f.files[ino]; s != nil {
		return s, nil
	}
	fd, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	s, err := newFileState(ino, fd)
	if err != nil {
		fd.Close()
		return nil, err
	}
	f.files[ino] = s
	return s, nil
}

// release drops a reference; a state without handles or unsynced writes
// is forgotten.
func (f *FS) release(s *fileState) {
	s.refs--
	f.forgetIfIdle(s)
}

func (f *FS) forgetIfIdle(s *fileState) {
	if s.refs <= 0 && !s.dirty && f.files[s.ino] == s {
		delete(f.files, s.ino)
		s.fd.Close()
	}
}

func (f *FS) syncFile(s *fileState) error {
	f.counters.Fsyncs++
	if f.last != nil && f.last.s == s {
		f.last = nil
	}
	return s.sync()
}

// dirFd returns a descriptor of the backing directory at path, kept until
// the next cut so that undoing an entry finds its directory whatever it is
// named by then.
func (f *FS) dirFd(path string) (uint64, *os.File, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, nil, err
	}
	if d := f.dirFds[st.Ino]; d != nil {
		return st.Ino, d, nil
	}
	d, err := os.OpenFile(path, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return 0, nil, err
	}
	f.dirFds[st.Ino] = d
	return st.Ino, d, nil
}

// in names an entry through a directory's descriptor, whatever the
// directory is named now.
func in(d *os.File, name string) string {
	return "/proc/self/fd/" + strconv.Itoa(int(d.Fd())) + "/" + name
}

// keep links the file at path into the stash, so that undoing its removal
// can bring it back, and returns the stash's name for it.
func (f *FS) keep(path string) (string, error) {
	f.stashed++
	p := filepath.Join(f.stash, strconv.Itoa(f.stashed))
	if err := os.Link(path, p); err != nil {
		return "", err
	}
	return p, nil
}

// entryOp is a change of directory entries not yet durable.
type entryOp struct {
	what string
	seq  uint64
	dirs []uint64
	undo func(f *FS) error
	// drop releases what the op kept for its undo, once it is durable.
	drop func()
}

// record logs an entry change in the directories dirs.
func (f *FS) record(what string, dirs []uint64, undo func(*FS) error, drop func()) {
	f.seq++
	f.log = append(f.log, &entryOp{what: what, seq: f.seq, dirs: dirs, undo: undo, drop: drop})
}

// syncDir makes durable every entry change whose directories are all
// fsynced since.
func (f *FS) syncDir(ino uint64) {
	f.counters.DirFsyncs++
	f.dirSync[ino] = f.seq
	kept := f.log[:0]
	for _, op := range f.log {
		durable := true
		for _, d := range op.dirs {
			if f.dirSync[d] < op.seq {
				durable = false
			}
		}
		if durable {
			if op.drop != nil {
				op.drop()
			}
			continue
		}
		kept = append(kept, op)
	}
	clear(f.log[len(kept):])
	f.log = kept
}

// Pending reports how many files hold unsynced writes and how many entry
// changes are not yet durable.
func (f *FS) Pending() (files, entries int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.files {
		if s.dirty {
			files++
		}
	}
	return files, len(f.log)
}

func removeQuiet(p string) {
	_ = os.Remove(p)
}

// undoCreate removes a name that was created.
func undoCreate(d *os.File, name string) func(*FS) error {
	return func(*FS) error { return os.RemoveAll(in(d, name)) }
}

// undoRemove brings back the file kept at stashed under name.
func undoRemove(d *os.File, name, stashed string) func(*FS) error {
	return func(*FS) error { return os.Link(stashed, in(d, name)) }
}

func errno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	return fs.ToErrno(err)
}
