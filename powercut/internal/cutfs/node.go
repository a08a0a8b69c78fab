package cutfs

import (
	"context"
	"os"
	"path/filepath"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// node is a file or directory of the mount. It takes from go-fuse's
// loopback what passes through unchanged (lookup, readdir, statfs, xattrs,
// readlink) and does itself everything a cut must be able to take back:
// data, sizes and directory entries. Every operation that reads or changes
// what a cut drops holds the file system's lock.
type node struct {
	*fs.LoopbackNode
	cfs *FS
}

var (
	_ fs.NodeWrapChilder    = (*node)(nil)
	_ fs.NodeLookuper       = (*node)(nil)
	_ fs.NodeGetattrer      = (*node)(nil)
	_ fs.NodeSetattrer      = (*node)(nil)
	_ fs.NodeOpener         = (*node)(nil)
	_ fs.NodeCreater        = (*node)(nil)
	_ fs.NodeMkdirer        = (*node)(nil)
	_ fs.NodeMknoder        = (*node)(nil)
	_ fs.NodeSymlinker      = (*node)(nil)
	_ fs.NodeLinker         = (*node)(nil)
	_ fs.NodeUnlinker       = (*node)(nil)
	_ fs.NodeRmdirer        = (*node)(nil)
	_ fs.NodeRenamer        = (*node)(nil)
	_ fs.NodeFsyncer        = (*node)(nil)
	_ fs.NodeOpendirHandler = (*node)(nil)
	_ fs.NodeTmpfiler       = (*node)(nil)
	_ fs.NodeCopyFileRanger = (*node)(nil)

	_ fs.FileReader    = (*handle)(nil)
	_ fs.FileWriter    = (*handle)(nil)
	_ fs.FileFsyncer   = (*handle)(nil)
	_ fs.FileFlusher   = (*handle)(nil)
	_ fs.FileReleaser  = (*handle)(nil)
	_ fs.FileGetattrer = (*handle)(nil)

	_ fs.FileFsyncdirer   = (*dirHandle)(nil)
	_ fs.FileReaddirenter = (*dirHandle)(nil)
	_ fs.FileReleasedirer = (*dirHandle)(nil)
	_ fs.FileSeekdirer    = (*dirHandle)(nil)
)

func (n *node) WrapChild(ctx context.Context, ops fs.InodeEmbedder) fs.InodeEmbedder {
	return &node{LoopbackNode: ops.(*fs.LoopbackNode), cfs: n.cfs}
}

// path is the node's path in the backing directory.
func (n *node) path() string {
	return filepath.Join(n.cfs.backing, n.Path(nil))
}

func (n *node) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	ch, e := n.LoopbackNode.Lookup(ctx, name, out)
	if e == 0 {
		n.cfs.mu.Lock()
		if s := n.cfs.files[out.Attr.Ino]; s != nil {
			out.Attr.Size, out.Attr.Blocks = uint64(s.size), uint64(s.size+511)/512
		}
		n.cfs.mu.Unlock()
	}
	return ch, e
}

func (n *node) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if h, ok := fh.(*handle); ok {
		return h.Getattr(ctx, out)
	}
	var st syscall.Stat_t
	var err error
	if n.IsRoot() {
		err = syscall.Stat(n.path(), &st)
	} else {
		err = syscall.Lstat(n.path(), &st)
	}
	if err != nil {
		return errno(err)
	}
	n.cfs.mu.Lock()
	if s := n.cfs.files[st.Ino]; s != nil {
		s.attr(&st)
	}
	n.cfs.mu.Unlock()
	out.FromStat(&st)
	return 0
}

// metadataBits are the attributes that pass through to the backing file at
// once.
const metadataBits = fuse.FATTR_MODE | fuse.FATTR_UID | fuse.FATTR_GID | fuse.FATTR_ATIME | fuse.FATTR_MTIME |
	fuse.FATTR_ATIME_NOW | fuse.FATTR_MTIME_NOW | fuse.FATTR_CTIME

func (n *node) Setattr(ctx context.Context, fh fs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if size, ok := in.GetSize(); ok {
		f := n.cfs
		f.mu.Lock()
		var s *fileState
		if h, ok := fh.(*handle); ok {
			s = h.s
		} else {
			var st syscall.Stat_t
			if err := syscall.Stat(n.path(), &st); err != nil {
				f.mu.Unlock()
				return errno(err)
			}
			var err error
			if s, err = f.state(st.Ino, n.path()); err != nil {
				f.mu.Unlock()
				return errno(err)
			}
		}
		s.truncate(int64(size))
		f.mu.Unlock()
	}
	if in.Valid&metadataBits != 0 {
		meta := *in
		meta.Valid &^= fuse.FATTR_SIZE | fuse.FATTR_FH
		if e := n.LoopbackNode.Setattr(ctx, nil, &meta, out); e != 0 {
			return e
		}
	}
	return n.Getattr(ctx, fh, out)
}

func (n *node) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	f := n.cfs
	p := n.path()
	f.mu.Lock()
	defer f.mu.Unlock()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return nil, 0, errno(err)
	}
	return f.open(st.Ino, p, flags)
}

// open returns a handle of the backing file at p.
func (f *FS) open(ino uint64, p string, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	s, err := f.state(ino, p)
	if err != nil {
		return nil, 0, errno(err)
	}
	s.refs++
	if flags&syscall.O_TRUNC != 0 {
		s.truncate(0)
	}
	return &handle{f: f, s: s, path: p, osync: flags&(syscall.O_SYNC|syscall.O_DSYNC) != 0}, 0, 0
}

func (n *node) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	f := n.cfs
	dir := n.path()
	p := filepath.Join(dir, name)
	f.mu.Lock()
	defer f.mu.Unlock()
	var st syscall.Stat_t
	switch err := syscall.Lstat(p, &st); {
	case err == nil && flags&syscall.O_EXCL != 0:
		return nil, nil, 0, syscall.EEXIST
	case err == nil:
	case err == syscall.ENOENT:
		fd, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, os.FileMode(mode&0o7777))
		if err != nil {
			return nil, nil, 0, errno(err)
		}
		fd.Close()
		if err := f.created("create "+p, dir, name); err != nil {
			return nil, nil, 0, errno(err)
		}
	default:
		return nil, nil, 0, errno(err)
	}
	ch, e := n.LoopbackNode.Lookup(ctx, name, out)
	if e != 0 {
		return nil, nil, 0, e
	}
	h, fl, e := f.open(out.Attr.Ino, p, flags)
	if e != 0 {
		return nil, nil, 0, e
	}
	s := h.(*handle).s
	out.Attr.Size, out.Attr.Blocks = uint64(s.size), uint64(s.size+511)/512
	return ch, h, fl, 0
}

// created logs that name was created in the backing directory dir.
func (f *FS) created(what, dir, name string) error {
	ino, d, err := f.dirFd(dir)
	if err != nil {
		return err
	}
	f.record(what, []uint64{ino}, undoCreate(d, name), nil)
	return nil
}

func (n *node) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.makeEntry(ctx, "mkdir", name, out, func(p string) error { return os.Mkdir(p, os.FileMode(mode&0o7777)) })
}

func (n *node) Mknod(ctx context.Context, name string, mode, rdev uint32, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.makeEntry(ctx, "mknod", name, out, func(p string) error { return syscall.Mknod(p, mode, int(rdev)) })
}

func (n *node) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	return n.makeEntry(ctx, "symlink", name, out, func(p string) error { return os.Symlink(target, p) })
}

func (n *node) Link(ctx context.Context, target fs.InodeEmbedder, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	t, ok := target.(*node)
	if !ok {
		return nil, syscall.EXDEV
	}
	if _, parent := t.Parent(); parent == nil {
		return nil, syscall.EXDEV // a file without a name: nothing to link from
	}
	src := t.path()
	return n.makeEntry(ctx, "link", name, out, func(p string) error { return os.Link(src, p) })
}

// makeEntry makes a new entry name in the backing directory with mk and
// logs it.
func (n *node) makeEntry(ctx context.Context, what, name string, out *fuse.EntryOut, mk func(p string) error) (*fs.Inode, syscall.Errno) {
	f := n.cfs
	dir := n.path()
	p := filepath.Join(dir, name)
	f.mu.Lock()
	if err := mk(p); err != nil {
		f.mu.Unlock()
		return nil, errno(err)
	}
	err := f.created(what+" "+p, dir, name)
	f.mu.Unlock()
	if err != nil {
		return nil, errno(err)
	}
	return n.Lookup(ctx, name, out)
}

func (n *node) Unlink(ctx context.Context, name string) syscall.Errno {
	f := n.cfs
	dir := n.path()
	p := filepath.Join(dir, name)
	f.mu.Lock()
	defer f.mu.Unlock()
	ino, d, err := f.dirFd(dir)
	if err != nil {
		return errno(err)
	}
	kept, err := f.keep(p)
	if err != nil {
		return errno(err)
	}
	if err := syscall.Unlink(p); err != nil {
		removeQuiet(kept)
		return errno(err)
	}
	f.record("unlink "+p, []uint64{ino}, undoRemove(d, name, kept), func() { removeQuiet(kept) })
	return 0
}

func (n *node) Rmdir(ctx context.Context, name string) syscall.Errno {
	f := n.cfs
	dir := n.path()
	p := filepath.Join(dir, name)
	f.mu.Lock()
	defer f.mu.Unlock()
	ino, d, err := f.dirFd(dir)
	if err != nil {
		return errno(err)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		return errno(err)
	}
	if err := syscall.Rmdir(p); err != nil {
		return errno(err)
	}
	mode := os.FileMode(st.Mode & 0o7777)
	f.record("rmdir "+p, []uint64{ino}, func(*FS) error { return os.Mkdir(in(d, name), mode) }, nil)
	return 0
}

func (n *node) Rename(ctx context.Context, name string, newParent fs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if flags&fs.RENAME_EXCHANGE != 0 {
		return syscall.EINVAL // not modelled
	}
	np, ok := newParent.(*node)
	if !ok {
		return syscall.EXDEV
	}
	f := n.cfs
	dir1, dir2 := n.path(), np.path()
	p1, p2 := filepath.Join(dir1, name), filepath.Join(dir2, newName)
	f.mu.Lock()
	defer f.mu.Unlock()
	ino1, d1, err := f.dirFd(dir1)
	if err != nil {
		return errno(err)
	}
	ino2, d2, err := f.dirFd(dir2)
	if err != nil {
		return errno(err)
	}
	var src, dst syscall.Stat_t
	if err := syscall.Lstat(p1, &src); err != nil {
		return errno(err)
	}
	// What the rename replaces, to bring back if it is undone.
	var kept string
	var replacedDir bool
	var replacedMode os.FileMode
	if err := syscall.Lstat(p2, &dst); err == nil {
		if dst.Ino == src.Ino {
			return errno(syscall.Rename(p1, p2)) // the same file: nothing changes
		}
		if dst.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			replacedDir, replacedMode = true, os.FileMode(dst.Mode&0o7777)
		} else if flags&unix.RENAME_NOREPLACE == 0 {
			if kept, err = f.keep(p2); err != nil {
				return errno(err)
			}
		}
	}
	if err := unix.Renameat2(unix.AT_FDCWD, p1, unix.AT_FDCWD, p2, uint(flags)); err != nil {
		if kept != "" {
			removeQuiet(kept)
		}
		return errno(err)
	}
	dirs := []uint64{ino1}
	if ino2 != ino1 {
		dirs = append(dirs, ino2)
	}
	undo := func(*FS) error {
		if err := os.Rename(in(d2, newName), in(d1, name)); err != nil {
			return err
		}
		switch {
		case kept != "":
			return os.Link(kept, in(d2, newName))
		case replacedDir:
			return os.Mkdir(in(d2, newName), replacedMode)
		}
		return nil
	}
	var drop func()
	if kept != "" {
		drop = func() { removeQuiet(kept) }
	}
	f.record("rename "+p1+" to "+p2, dirs, undo, drop)
	return 0
}

// Tmpfile is refused: a file without a name is not modelled, and callers
// fall back on a named file.
func (n *node) Tmpfile(ctx context.Context, flags, mode uint32, out *fuse.EntryOut) (*fs.Inode, fs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EOPNOTSUPP
}

// CopyFileRange is refused, so that the kernel copies through reads and
// writes.
func (n *node) CopyFileRange(ctx context.Context, fhIn fs.FileHandle, offIn uint64, out *fs.Inode, fhOut fs.FileHandle,
	offOut uint64, length uint64, flags uint64) (uint32, syscall.Errno) {
	return 0, syscall.EOPNOTSUPP
}

func (n *node) Fsync(ctx context.Context, fh fs.FileHandle, flags uint32) syscall.Errno {
	f := n.cfs
	if h, ok := fh.(*handle); ok {
		return h.Fsync(ctx, flags)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(n.path(), &st); err != nil {
		return errno(err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
		f.syncDir(st.Ino)
		return 0
	}
	if s := f.files[st.Ino]; s != nil {
		err := f.syncFile(s)
		f.forgetIfIdle(s)
		return errno(err)
	}
	return 0
}

func (n *node) OpendirHandle(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	ds, e := fs.NewLoopbackDirStream(n.path())
	if e != 0 {
		return nil, 0, e
	}
	return &dirHandle{DirStream: ds, n: n}, 0, 0
}

// dirHandle is an open directory: reading passes through, fsync makes its
// entries durable.
type dirHandle struct {
	fs.DirStream
	n *node
}

func (d *dirHandle) Fsyncdir(ctx context.Context, flags uint32) syscall.Errno {
	return d.n.Fsync(ctx, nil, flags)
}

func (d *dirHandle) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	if r, ok := d.DirStream.(fs.FileReaddirenter); ok {
		return r.Readdirent(ctx)
	}
	if !d.HasNext() {
		return nil, 0
	}
	e, errno := d.Next()
	return &e, errno
}

func (d *dirHandle) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	if s, ok := d.DirStream.(fs.FileSeekdirer); ok {
		return s.Seekdir(ctx, off)
	}
	return syscall.ENOTSUP
}

func (d *dirHandle) Releasedir(ctx context.Context, flags uint32) {
	if r, ok := d.DirStream.(fs.FileReleasedirer); ok {
		r.Releasedir(ctx, flags)
		return
	}
	d.Close()
}

// handle is an open file: its reads and writes go to the file's state.
type handle struct {
	f     *FS
	s     *fileState
	path  string
	osync bool // opened O_SYNC or O_DSYNC: every write is durable when it returns
}

func (h *handle) Read(ctx context.Context, buf []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	n, err := h.s.read(buf, off)
	if err != nil {
		return nil, errno(err)
	}
	return fuse.ReadResultData(buf[:n]), 0
}

func (h *handle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	if err := h.s.write(data, off); err != nil {
		return 0, errno(err)
	}
	// The kernel splits a write at page boundaries: a write that goes on
	// where the last one ended is the same write, as far as tearing goes.
	if l := h.f.last; l != nil && l.s == h.s && l.off+int64(len(l.data)) == off {
		l.data = append(l.data, data...)
	} else {
		h.f.last = &lastWrite{s: h.s, path: h.path, off: off, data: append([]byte(nil), data...)}
	}
	if h.osync {
		if err := h.f.syncFile(h.s); err != nil {
			return 0, errno(err)
		}
	}
	return uint32(len(data)), 0
}

func (h *handle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	return errno(h.f.syncFile(h.s))
}

// Flush (each close of a descriptor) makes nothing durable.
func (h *handle) Flush(ctx context.Context) syscall.Errno { return 0 }

func (h *handle) Release(ctx context.Context) syscall.Errno {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	h.f.release(h.s)
	return 0
}

func (h *handle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	h.f.mu.Lock()
	defer h.f.mu.Unlock()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(h.s.fd.Fd()), &st); err != nil {
		return errno(err)
	}
	h.s.attr(&st)
	out.FromStat(&st)
	return 0
}
