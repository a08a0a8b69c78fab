// Package powercut holds idem's power-cut tests, in a module of their own so
// that their FUSE dependency (go-fuse) never reaches a user of idem.
//
// Every other crash test of idem SIGKILLs a process, which loses nothing it
// wrote: the page cache survives. These run the client's journal, or the
// server's key store, on internal/cutfs, a FUSE file system that forgets on
// a simulated power cut everything not fsynced, so that they tell an fsync
// that is there from one that is not. See RELIABILITY.md.
package powercut
