package postgres

import "time"

// stuckAfter is how long writes may wait while no batch begins before a
// second batch takes them beside the one running.
const stuckAfter = time.Second

// watchBatches starts a second batch (see secondBatch) when writes have waited a
// whole stuckAfter and no batch began meanwhile: the one running is stuck,
// most likely on a row lock another session holds (SELECT … FOR UPDATE, an
// operator's transaction), and the writes queued behind it, of rows no one
// locked, must not wait for its bound (30-40 s). A batch that is merely
// slow has let the next begin within stuckAfter at any load the journal
// was measured at, so this changes nothing there; and at one caller no
// write ever waits, so no watch runs. One watch runs while writes wait,
// with one timer, and ends once the queue is found empty, or at Close.
// Two batches stuck at once (maxRunning) still hold what waits.
func (j *Journal) watchBatches() {
	defer j.watched.Done()
	t := time.NewTimer(stuckAfter)
	defer t.Stop()
	j.mu.Lock()
	seen := j.batches
	j.mu.Unlock()
	for {
		select {
		case <-j.unwatch:
			j.mu.Lock()
			j.watching = false
			j.mu.Unlock()
			return
		case <-t.C:
		}
		j.mu.Lock()
		if len(j.queue) == 0 {
			j.watching = false
			j.mu.Unlock()
			return
		}
		start := j.batches == seen && j.running < maxRunning
		if start {
			j.running++
		}
		seen = j.batches
		j.mu.Unlock()
		if start {
			go j.commit(false)
		}
		t.Reset(stuckAfter)
	}
}
