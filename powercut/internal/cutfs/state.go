package cutfs

import (
	"io"
	"os"
	"syscall"
)

// pageSize is the unit in which unsynced writes are held. Any size works;
// the kernel's page size keeps reads of whole pages cheap.
const pageSize = 4096

// fileState is one backing file (one inode: every name and every open
// handle of it share it) while it has unsynced writes or open handles.
//
// The backing file holds what is durable. Writes and truncations since the
// last fsync live here: pages holds the current content of every page
// written since, size the file's current size, and floor the lowest size
// the file was truncated to since: bytes of the backing file at or past
// floor are no longer part of the file (a truncation then an extension
// reads zeros there, not the old bytes). Reads see this layer over the
// backing file; fsync writes it into the backing file; a cut drops it.
//
// Every method is called with the file system's lock held.
type fileState struct {
	ino  uint64
	fd   *os.File // the backing file, read-write
	refs int      // open handles

	size  int64
	floor int64
	pages map[int64][]byte
	dirty bool
	// written counts the bytes written since the last fsync (for the cut's
	// report).
	written int64
}

func newFileState(ino uint64, fd *os.File) (*fileState, error) {
	fi, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	return &fileState{ino: ino, fd: fd, size: fi.Size(), floor: fi.Size(), pages: map[int64][]byte{}}, nil
}

// page returns page p as the file holds it now, loading it from the
// backing file (the part below floor) the first time.
func (s *fileState) page(p int64) ([]byte, error) {
	if pg, ok := s.pages[p]; ok {
		return pg, nil
	}
	pg := make([]byte, pageSize)
	start := p * pageSize
	if start < s.floor {
		n := min(int64(pageSize), s.floor-start)
		if _, err := s.fd.ReadAt(pg[:n], start); err != nil && err != io.EOF {
			return nil, err
		}
	}
	s.pages[p] = pg
	return pg, nil
}

// read fills buf from offset off and returns how many bytes the file holds
// there.
func (s *fileState) read(buf []byte, off int64) (int, error) {
	if off >= s.size {
		return 0, nil
	}
	n := int(min(int64(len(buf)), s.size-off))
	buf = buf[:n]
	clear(buf)
	if !s.dirty {
		_, err := s.fd.ReadAt(buf, off)
		if err == io.EOF {
			err = nil
		}
		return n, err
	}
	// What the backing file holds below floor, then the pages over it.
	if off < s.floor {
		m := min(int64(n), s.floor-off)
		if _, err := s.fd.ReadAt(buf[:m], off); err != nil && err != io.EOF {
			return 0, err
		}
	}
	end := off + int64(n)
	for p := off / pageSize; p*pageSize < end; p++ {
		pg, ok := s.pages[p]
		if !ok {
			continue
		}
		start := p * pageSize
		lo, hi := max(start, off), min(start+pageSize, end)
		copy(buf[lo-off:hi-off], pg[lo-start:hi-start])
	}
	return n, nil
}

// write writes data at off into the unsynced layer.
func (s *fileState) write(data []byte, off int64) error {
	end := off + int64(len(data))
	for p := off / pageSize; p*pageSize < end; p++ {
		pg, err := s.page(p)
		if err != nil {
			return err
		}
		start := p * pageSize
		lo, hi := max(start, off), min(start+pageSize, end)
		copy(pg[lo-start:hi-start], data[lo-off:hi-off])
	}
	s.size = max(s.size, end)
	s.dirty = true
	s.written += int64(len(data))
	return nil
}

// truncate sets the file's size in the unsynced layer.
func (s *fileState) truncate(size int64) {
	if size < s.size {
		for p, pg := range s.pages {
			start := p * pageSize
			switch {
			case start >= size:
				delete(s.pages, p)
			case start+pageSize > size:
				clear(pg[size-start:])
			}
		}
		s.floor = min(s.floor, size)
	}
	s.size = size
	s.dirty = true
}

// sync makes the unsynced layer durable: it writes it into the backing
// file, which is the durable state. (The backing file is not fsynced in
// turn: its own durability is not what a test of the mount is about.)
func (s *fileState) sync() error {
	if !s.dirty {
		return nil
	}
	fi, err := s.fd.Stat()
	if err != nil {
		return err
	}
	if s.floor < fi.Size() {
		if err := s.fd.Truncate(s.floor); err != nil {
			return err
		}
	}
	for p, pg := range s.pages {
		start := p * pageSize
		if start >= s.size {
			continue
		}
		if _, err := s.fd.WriteAt(pg[:min(int64(pageSize), s.size-start)], start); err != nil {
			return err
		}
	}
	if err := s.fd.Truncate(s.size); err != nil {
		return err
	}
	s.discard(s.size)
	return nil
}

// discard drops the unsynced layer: the file is what the backing file
// holds, size bytes.
func (s *fileState) discard(size int64) {
	s.pages = map[int64][]byte{}
	s.size, s.floor = size, size
	s.dirty = false
	s.written = 0
}

// attr corrects st, the backing file's attributes, with the unsynced size.
func (s *fileState) attr(st *syscall.Stat_t) {
	st.Size = s.size
	st.Blocks = (s.size + 511) / 512
}
