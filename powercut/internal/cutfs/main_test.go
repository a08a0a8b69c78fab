package cutfs

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// With CUTFS_MMAP_CHILD set, the test binary maps that file twice instead
// of running the tests (see TestSharedMmap).
func TestMain(m *testing.M) {
	if p := os.Getenv("CUTFS_MMAP_CHILD"); p != "" {
		if err := mmapChild(p); err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	// Every mount's server stops with its unmount: nothing may be left running.
	goleak.VerifyTestMain(m)
}

func mmapChild(p string) error {
	var maps [2][]byte
	for i := range maps {
		fd, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer fd.Close()
		if maps[i], err = mmapShared(fd, pageSize); err != nil {
			return err
		}
	}
	copy(maps[0], "through the mapping")
	if string(maps[1][:19]) != "through the mapping" {
		return fmt.Errorf("the second mapping reads %q", maps[1][:19])
	}
	for _, m := range maps {
		if err := munmap(m); err != nil {
			return err
		}
	}
	fmt.Println("two mappings share their pages")
	return nil
}
