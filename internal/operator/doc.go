// Package operator is what an operator sees of a journal and may do to
// it, shared by the idem command's text output and its web view (idem ui)
// so that both say the same things and apply the same rules: how a record,
// its history, its headers and bodies are shown; the counts by state and
// scope; and the settling of an operation by hand (reconcile, cancel),
// which goes through a client and refuses an operation that a live
// process is driving.
package operator
