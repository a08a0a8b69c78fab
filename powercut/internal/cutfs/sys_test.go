package cutfs

import (
	"os"

	"golang.org/x/sys/unix"
)

func fdatasync(f *os.File) error { return unix.Fdatasync(int(f.Fd())) }

func mmapShared(f *os.File, n int) ([]byte, error) {
	return unix.Mmap(int(f.Fd()), 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
}

func munmap(b []byte) error { return unix.Munmap(b) }
