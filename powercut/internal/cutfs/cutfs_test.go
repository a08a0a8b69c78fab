package cutfs

import (
	"bytes"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var usable = sync.OnceValue(Usable)

// mount mounts a power-cut file system for the test, or skips it where
// FUSE cannot be mounted.
func mount(t *testing.T) *FS {
	t.Helper()
	if err := usable(); err != nil {
		t.Skipf("FUSE cannot be used here, so the power-cut file system cannot be tested: %v", err)
	}
	dir := t.TempDir()
	backing := filepath.Join(dir, "disk")
	require.NoError(t, os.Mkdir(backing, 0o700))
	f, err := Mount(filepath.Join(dir, "mnt"), backing, filepath.Join(dir, "stash"))
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, f.Unmount()) })
	return f
}

// cut cuts the power, without tearing.
func cut(t *testing.T, f *FS) Cut {
	t.Helper()
	c, err := f.Cut(nil)
	require.NoError(t, err)
	return c
}

func syncDir(t *testing.T, dir string) {
	t.Helper()
	d, err := os.Open(dir)
	require.NoError(t, err)
	require.NoError(t, d.Sync())
	require.NoError(t, d.Close())
}

// durableFile creates a file with content whose data and name are both
// durable.
func durableFile(t *testing.T, f *FS, name string, content []byte) string {
	t.Helper()
	p := filepath.Join(f.Dir(), name)
	fd, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	require.NoError(t, err)
	_, err = fd.Write(content)
	require.NoError(t, err)
	require.NoError(t, fd.Sync())
	require.NoError(t, fd.Close())
	syncDir(t, filepath.Dir(p))
	files, entries := f.Pending()
	require.Zero(t, files+entries, "nothing pending after fsync of the file and its directory")
	return p
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	require.NoError(t, err)
	return b
}

func TestWriteWithoutFsyncIsGoneAfterCut(t *testing.T) {
	f := mount(t)
	p := durableFile(t, f, "a", []byte("synced"))

	fd, err := os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = fd.WriteAt([]byte("SYNCED and more"), 0)
	require.NoError(t, err)
	require.NoError(t, fd.Close())
	assert.Equal(t, "SYNCED and more", string(readFile(t, p)), "readers see writes not yet synced")
	assert.Equal(t, "synced", string(readFile(t, filepath.Join(f.Backing(), "a"))), "the disk does not have them yet")

	c := cut(t, f)
	assert.Equal(t, "synced", string(readFile(t, p)), "the unsynced write is gone")
	assert.Equal(t, 1, c.Files)
	assert.EqualValues(t, len("SYNCED and more"), c.Bytes)
	assert.Zero(t, c.Entries)
}

func TestFsyncedWriteStays(t *testing.T) {
	for _, datasync := range []bool{false, true} {
		t.Run(map[bool]string{false: "fsync", true: "fdatasync"}[datasync], func(t *testing.T) {
			f := mount(t)
			p := durableFile(t, f, "a", nil)
			fd, err := os.OpenFile(p, os.O_RDWR, 0)
			require.NoError(t, err)
			big := bytes.Repeat([]byte("0123456789abcdef"), 1000) // spans pages, ends mid-page
			_, err = fd.WriteAt(big, 100)
			require.NoError(t, err)
			if datasync {
				require.NoError(t, fdatasync(fd))
			} else {
				require.NoError(t, fd.Sync())
			}
			_, err = fd.WriteAt([]byte("lost"), 5000) // after the sync: gone
			require.NoError(t, err)
			require.NoError(t, fd.Close())

			c := cut(t, f)
			want := append(make([]byte, 100), big...)
			assert.Equal(t, want, readFile(t, p), "what was synced stays, byte for byte; the later write is gone")
			assert.Equal(t, 1, c.Files)
			assert.EqualValues(t, 4, c.Bytes)
		})
	}
}

func TestOpenSyncWritesAreDurable(t *testing.T) {
	f := mount(t)
	p := durableFile(t, f, "a", nil)
	fd, err := os.OpenFile(p, os.O_RDWR|os.O_SYNC, 0)
	require.NoError(t, err)
	_, err = fd.Write([]byte("each write synced"))
	require.NoError(t, err)
	require.NoError(t, fd.Close())
	c := cut(t, f)
	assert.Equal(t, "each write synced", string(readFile(t, p)))
	assert.Zero(t, c.Files)
}

func TestTruncationWithoutFsyncIsGone(t *testing.T) {
	f := mount(t)
	content := bytes.Repeat([]byte{'s'}, 3*pageSize+10)
	p := durableFile(t, f, "a", content)

	fd, err := os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	require.NoError(t, fd.Truncate(100))
	_, err = fd.WriteAt([]byte("end"), int64(len(content))-3) // grows it back
	require.NoError(t, err)
	require.NoError(t, fd.Close())
	got := readFile(t, p)
	want := append(append(bytes.Repeat([]byte{'s'}, 100), make([]byte, len(content)-103)...), "end"...)
	require.Equal(t, want, got, "a truncation then a write past it reads zeros in between, not the old bytes")

	cut(t, f)
	assert.Equal(t, content, readFile(t, p), "the truncation is gone with the cut")

	// Synced, the same sequence stays.
	fd, err = os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	require.NoError(t, fd.Truncate(100))
	_, err = fd.WriteAt([]byte("end"), int64(len(content))-3)
	require.NoError(t, err)
	require.NoError(t, fd.Sync())
	require.NoError(t, fd.Close())
	cut(t, f)
	assert.Equal(t, want, readFile(t, p))
}

func TestNewFileWithoutDirectoryFsyncIsGone(t *testing.T) {
	f := mount(t)
	p := filepath.Join(f.Dir(), "new")
	fd, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	require.NoError(t, err)
	_, err = fd.Write([]byte("data synced, name not"))
	require.NoError(t, err)
	require.NoError(t, fd.Sync())
	require.NoError(t, fd.Close())

	c := cut(t, f)
	_, err = os.Stat(p)
	assert.ErrorIs(t, err, os.ErrNotExist, "a name its directory never synced is gone")
	assert.Equal(t, 1, c.Entries)

	// With the directory synced, it stays.
	require.NoError(t, os.WriteFile(p, []byte("x"), 0o600))
	syncDir(t, f.Dir())
	cut(t, f)
	assert.Equal(t, "", string(readFile(t, p)), "the name stays; the data, never synced, does not")
}

func TestMkdirWithoutDirectoryFsyncIsGone(t *testing.T) {
	f := mount(t)
	d := filepath.Join(f.Dir(), "sub")
	require.NoError(t, os.Mkdir(d, 0o700))
	p := filepath.Join(d, "a")
	require.NoError(t, os.WriteFile(p, []byte("in a directory whose own entry is not durable"), 0o600))
	fd, err := os.Open(p)
	require.NoError(t, err)
	require.NoError(t, fd.Sync())
	require.NoError(t, fd.Close())
	syncDir(t, d)
	files, entries := f.Pending()
	require.Equal(t, [2]int{0, 1}, [2]int{files, entries}, "only the directory's own entry is not durable")
	cut(t, f)
	_, err = os.Stat(d)
	assert.ErrorIs(t, err, os.ErrNotExist)
}

func TestRenameWithoutDirectoryFsyncIsGone(t *testing.T) {
	f := mount(t)
	a := durableFile(t, f, "a", []byte("A"))
	b := durableFile(t, f, "b", []byte("B"))

	require.NoError(t, os.Rename(a, b))
	_, err := os.Stat(a)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Equal(t, "A", string(readFile(t, b)))

	c := cut(t, f)
	assert.Equal(t, "A", string(readFile(t, a)), "the rename is undone")
	assert.Equal(t, "B", string(readFile(t, b)), "and the file it replaced is back")
	assert.Equal(t, 1, c.Entries)

	require.NoError(t, os.Rename(a, b))
	syncDir(t, f.Dir())
	cut(t, f)
	_, err = os.Stat(a)
	assert.ErrorIs(t, err, os.ErrNotExist, "synced, the rename stays")
	assert.Equal(t, "A", string(readFile(t, b)))
}

func TestRenameAcrossDirectoriesNeedsBoth(t *testing.T) {
	f := mount(t)
	require.NoError(t, os.Mkdir(filepath.Join(f.Dir(), "d"), 0o700))
	syncDir(t, f.Dir())
	a := durableFile(t, f, "a", []byte("A"))
	moved := filepath.Join(f.Dir(), "d", "a")

	require.NoError(t, os.Rename(a, moved))
	syncDir(t, filepath.Join(f.Dir(), "d")) // the target's directory only
	cut(t, f)
	assert.Equal(t, "A", string(readFile(t, a)), "undone: its source directory was not synced")
	_, err := os.Stat(moved)
	assert.ErrorIs(t, err, os.ErrNotExist)

	require.NoError(t, os.Rename(a, moved))
	syncDir(t, filepath.Join(f.Dir(), "d"))
	syncDir(t, f.Dir())
	cut(t, f)
	assert.Equal(t, "A", string(readFile(t, moved)))
}

func TestUnlinkWithoutDirectoryFsyncComesBack(t *testing.T) {
	f := mount(t)
	a := durableFile(t, f, "a", []byte("still here"))
	require.NoError(t, os.Remove(a))
	cut(t, f)
	assert.Equal(t, "still here", string(readFile(t, a)))

	require.NoError(t, os.Remove(a))
	syncDir(t, f.Dir())
	cut(t, f)
	_, err := os.Stat(a)
	assert.ErrorIs(t, err, os.ErrNotExist)
	entries, err := os.ReadDir(filepath.Join(filepath.Dir(f.Backing()), "stash"))
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing kept once the removal is durable and the cut is over")
}

func TestTornWrite(t *testing.T) {
	f := mount(t)
	p := durableFile(t, f, "a", nil)
	rnd := rand.New(rand.NewPCG(1, 2))
	seen := map[int]bool{}
	for range 20 {
		fd, err := os.OpenFile(p, os.O_RDWR, 0)
		require.NoError(t, err)
		_, err = fd.WriteAt(bytes.Repeat([]byte{'t'}, 4000), 100) // sectors 0 to 7
		require.NoError(t, err)
		require.NoError(t, fd.Close())

		c, err := f.Cut(rnd)
		require.NoError(t, err)
		require.True(t, c.Torn)
		got := readFile(t, p)
		assert.Equal(t, c.TornKept+100, len(got), "the file ends where the write was torn")
		assert.Zero(t, len(got)%sectorSize, "at a sector boundary")
		assert.Greater(t, len(got), 100)
		assert.Less(t, len(got), 4100)
		assert.Equal(t, append(make([]byte, 100), bytes.Repeat([]byte{'t'}, len(got)-100)...), got)
		seen[len(got)] = true
		require.NoError(t, os.Truncate(p, 0))
		fd, err = os.OpenFile(p, os.O_RDWR, 0)
		require.NoError(t, err)
		require.NoError(t, fd.Sync())
		require.NoError(t, fd.Close())
	}
	assert.Greater(t, len(seen), 2, "tears land at different boundaries")

	// A write within one sector cannot tear; a synced one is not torn.
	fd, err := os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = fd.WriteAt([]byte("small"), 0)
	require.NoError(t, err)
	require.NoError(t, fd.Close())
	c, err := f.Cut(rnd)
	require.NoError(t, err)
	assert.False(t, c.Torn)
	assert.Empty(t, readFile(t, p))

	fd, err = os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	_, err = fd.WriteAt(bytes.Repeat([]byte{'s'}, 2000), 0)
	require.NoError(t, err)
	require.NoError(t, fd.Sync())
	require.NoError(t, fd.Close())
	c, err = f.Cut(rnd)
	require.NoError(t, err)
	assert.False(t, c.Torn)
	assert.Len(t, readFile(t, p), 2000)
}

// TestSharedMmap maps a file of the mount shared, twice, in a child
// process: a process must never fault on a mapping of a FUSE file system
// it serves itself (the fault holds the process's memory map while the
// server's goroutines may need it), which is why every user of the mount
// in the power-cut loops is a child process. What the mapping wrote
// reaches the file's readers, and, never synced, is gone after a cut.
func TestSharedMmap(t *testing.T) {
	f := mount(t)
	p := durableFile(t, f, "shm", make([]byte, pageSize))
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CUTFS_MMAP_CHILD="+p)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "two mappings share their pages\n", string(out))
	assert.Equal(t, "through the mapping", string(readFile(t, p)[:19]), "the kernel wrote the mapping's pages back")
	c := cut(t, f)
	assert.Equal(t, 1, c.Files)
	assert.Equal(t, make([]byte, pageSize), readFile(t, p), "never synced, they are gone")
}

func TestCutRefusedWhileAFileIsOpen(t *testing.T) {
	f := mount(t)
	p := durableFile(t, f, "a", nil)
	fd, err := os.Open(p)
	require.NoError(t, err)
	_, err = f.Cut(nil)
	assert.ErrorContains(t, err, "still using it")
	require.NoError(t, fd.Close())
	// The mount is still there, and a cut now works.
	cut(t, f)
	assert.Empty(t, readFile(t, p))
}
