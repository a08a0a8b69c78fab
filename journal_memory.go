package idem

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"iter"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idemkit/idem/journal"
)

// MemoryJournal is a Journal held in process memory. It is NOT durable: a
// crash or a restart forgets every operation, so a retried operation after a
// restart gets a new key. Use it in tests, or when all you want is key reuse
// within one process's lifetime. Use OpenSQLite for anything that must
// survive a crash.
//
// The zero value is not usable; call NewMemoryJournal. A MemoryJournal is
// safe for concurrent use.
//
// A stored record is never changed in place: every write stores a new one
// (the rules return copies), so a record read under the lock may be copied
// for the caller, and a leased write's rules applied to it, after the lock
// is released. The lock is held only to look up, check and swap, which is
// what many goroutines calling at once wait for.
type MemoryJournal struct {
	mu      sync.Mutex
	closed  bool
	maxBody int
	now     func() time.Time
	seq     int64
	byKey   map[string]*memEntry
	byOp    map[scopeID]*memEntry
	// live and gone are the registered owners and those that unregistered:
	// in one process, an owner is gone exactly when it says so.
	live map[string]bool
	gone map[string]bool
}

type scopeID struct{ scope, id string }

type memEntry struct {
	seq int64  // insertion order, for List
	gen uint64 // counts the writes of the record, for Update's compare-and-swap
	// live is the record while it is unsettled, nil once it is packed.
	live *memLive
	// packed is a settled record and its history (see packRecord), body
	// and respBody its request's and its Response's bodies; none is
	// changed in place, so a reader may unpack them after the lock.
	packed, body, respBody []byte
}

// memLive is an entry's record as the rules write it.
type memLive struct {
	// rec is the record, but for its request's Header and its Response's,
	// which header and respHeader hold (see packedHeader): the request's
	// is the client's own map until the record is packed (see memHeader).
	rec        Record
	header     memHeader
	respHeader packedHeader
	history    []Event
	// events is the room of history's first two events, a create and the
	// outcome of a call that goes right: no allocation of their own.
	events [2]Event
}

// memLives are the live forms of records that settled, for new ones: a
// call that goes right makes one and packs it soon after.
var memLives = sync.Pool{New: func() any { return new(memLive) }}

// memStored is what a reader takes of an entry under the lock, to read
// after it: the live record (its fields copied) or the packed one.
type memStored struct {
	rec                    Record
	header                 memHeader
	respHeader             packedHeader
	packed, body, respBody []byte
}

// stored returns what e holds now. The caller holds m.mu.
func (e *memEntry) stored() memStored {
	if l := e.live; l != nil {
		return memStored{rec: l.rec, header: l.header, respHeader: l.respHeader}
	}
	return memStored{packed: e.packed, body: e.body, respBody: e.respBody}
}

// record returns the stored record, sharing its bodies, without its
// headers, which it returns as stored: the request's and the Response's.
func (s memStored) record() (Record, memHeader, packedHeader) {
	if s.packed == nil {
		return s.rec, s.header, s.respHeader
	}
	rec, header, resp, _ := unpackRecord(s.packed, s.body, s.respBody, false)
	return rec, packedAs(header), resp
}

// copy returns a copy of the stored record that the caller owns.
func (s memStored) copy() Record {
	if s.packed == nil {
		return copyOf(s.rec, s.header, s.respHeader)
	}
	// Unpacked, the record's strings and Response are its own already;
	// its bodies are the stored ones and its headers are to be made.
	rec, header, resp, _ := unpackRecord(s.packed, s.body, s.respBody, false)
	rec.Body = cloneBody(rec.Body)
	rec.Header = header.header()
	if rec.Response != nil {
		rec.Response.Body = cloneBody(rec.Response.Body)
		rec.Response.Header = resp.header()
	}
	return rec
}

// cloneBody returns a copy of b, nil if b is empty, as journals return
// bodies.
func cloneBody(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return slices.Clone(b)
}

// record returns e's record as stored (see memStored.record). The caller
// holds m.mu.
func (e *memEntry) record() Record {
	rec, _, _ := e.stored().record()
	return rec
}

// open returns e's live form to write, unpacking a packed record (a
// settled one written again, which is rare). The caller holds m.mu and
// calls wrote once it has written.
func (e *memEntry) open() *memLive {
	if e.live != nil {
		return e.live
	}
	rec, header, resp, history := unpackRecord(e.packed, e.body, e.respBody, true)
	return &memLive{rec: rec, header: packedAs(header), respHeader: resp, history: history}
}

// wrote stores l, written, as e's record: packed if it is settled, the
// form a journal keeps most of, and that the collector need not scan.
// answer is the Response this write gave the record, as the writer gave
// it, or nil: l.rec.Response (the rules' copy) has its status but not yet
// its header and body, which are copied here into the form the record is
// kept in, and l.respHeader is not its header. wrote returns the stored
// Response's body. The caller holds m.mu.
func (e *memEntry) wrote(l *memLive, answer *Response) []byte {
	e.gen++
	resp, fresh := packedAs(l.respHeader), []byte(nil)
	if answer != nil {
		resp, fresh = memHeader{m: answer.Header}, answer.Body
	}
	if l.rec.State.Terminal() {
		if p, body, ok := packRecord(l.rec, l.header, resp, fresh, l.history); ok {
			e.live, e.packed, e.body, e.respBody = nil, p, l.rec.Body, nil
			if l.rec.Response != nil {
				e.respBody = l.rec.Response.Body
				if answer != nil {
					e.respBody = body
				}
			}
			// Nothing holds l now: readers copy its fields, and its
			// history (a slice of its events) only under the lock.
			*l = memLive{}
			memLives.Put(l)
			return e.respBody
		}
	}
	if answer != nil {
		l.respHeader = packHeader(answer.Header)
		l.rec.Response.Body = cloneBody(answer.Body)
	}
	e.live, e.packed, e.body, e.respBody = l, nil, nil, nil
	if l.rec.Response != nil {
		return l.rec.Response.Body
	}
	return nil
}

// packedSettle is a live record settled by a write, packed (packSettle)
// before the write takes the lock: ok is false when it could not be, and
// the write then stores it as wrote does.
type packedSettle struct {
	packed, respBody []byte
	ok               bool
}

// packSettle packs out, the terminal record a write of answer (or nil)
// makes of a live record whose request header is header and whose
// history, with the write's event, is history: as wrote packs it.
func packSettle(out Record, header memHeader, answer *Response, history []Event) packedSettle {
	var resp memHeader
	var fresh []byte
	if answer != nil {
		resp, fresh = memHeader{m: answer.Header}, answer.Body
	}
	p, body, ok := packRecord(out, header, resp, fresh, history)
	return packedSettle{packed: p, respBody: body, ok: ok}
}

// settle stores out, which p packs, as e's record in place of its live
// form, as wrote does; the caller holds m.mu and gives the live form back
// to the pool.
func (e *memEntry) settle(out Record, p packedSettle) {
	e.gen++
	e.live, e.packed, e.body, e.respBody = nil, p.packed, out.Body, nil
	if out.Response != nil {
		e.respBody = p.respBody
	}
}

// historyCopy returns a copy of e's history. The caller holds m.mu.
func (e *memEntry) historyCopy() []Event {
	if e.live != nil {
		return slices.Clone(e.live.history)
	}
	_, _, _, history := unpackRecord(e.packed, e.body, e.respBody, true)
	return history
}

// copyOf returns a copy of rec, e's record or one the rules made of it
// (sharing its request and Response), whose headers are header and resp.
func copyOf(rec Record, header memHeader, resp packedHeader) Record {
	out := journal.CloneRecord(rec)
	out.Header = header.header()
	if out.Response != nil {
		out.Response.Header = resp.header()
	}
	return out
}

// packedHeader is a stored request's or response's header in one byte slice: the count
// of names and of values, then each name and its values, each a length and
// its bytes (a value count of 0 is a nil slice, n+1 otherwise). A journal
// that keeps every record keeps every header: as a map, it is a few
// objects with pointers (the map, its table, the values' array) that every
// garbage collection marks; as bytes, one that none scans.
type packedHeader []byte

func packHeader(h http.Header) packedHeader {
	if len(h) == 0 {
		return nil
	}
	size, values := packedHeaderSize(h)
	return appendHeader(make([]byte, 0, size), h, values)
}

// packedHeaderSize returns the length of h packed, exactly (a record packs
// a writer's header straight into its own bytes, after that length), and
// the count of its values.
func packedHeaderSize(h http.Header) (size, values int) {
	if len(h) == 0 {
		return 0, 0
	}
	for k, vs := range h {
		size += uvarintLen(len(k)) + len(k)
		if vs == nil {
			size++
			continue
		}
		size += uvarintLen(len(vs) + 1)
		for _, v := range vs {
			size += uvarintLen(len(v)) + len(v)
		}
		values += len(vs)
	}
	return size + uvarintLen(len(h)) + uvarintLen(values), values
}

// uvarintLen is the length of n as binary.AppendUvarint writes it.
func uvarintLen(n int) int {
	l := 1
	for ; n >= 0x80; n >>= 7 {
		l++
	}
	return l
}

// appendHeader appends h, whose values number values, packed to p; an
// empty h appends nothing.
func appendHeader(p []byte, h http.Header, values int) []byte {
	if len(h) == 0 {
		return p
	}
	p = binary.AppendUvarint(p, uint64(len(h)))
	p = binary.AppendUvarint(p, uint64(values))
	for k, vs := range h {
		p = binary.AppendUvarint(p, uint64(len(k)))
		p = append(p, k...)
		if vs == nil {
			p = append(p, 0)
			continue
		}
		p = binary.AppendUvarint(p, uint64(len(vs))+1)
		for _, v := range vs {
			p = binary.AppendUvarint(p, uint64(len(v)))
			p = append(p, v...)
		}
	}
	return p
}

// header returns a new http.Header with p's names and values: three
// allocations (the map, the values' array, one string they all share).
func (p packedHeader) header() http.Header {
	if len(p) == 0 {
		return nil
	}
	s := string(p)
	i := 0
	next := func() int {
		v, n := binary.Uvarint(p[i:])
		i += n
		return int(v)
	}
	str := func() string {
		n := next()
		i += n
		return s[i-n : i]
	}
	names, values := next(), next()
	h := make(http.Header, names)
	vals := make([]string, values)
	for range names {
		k := str()
		n := next()
		if n == 0 {
			h[k] = nil
			continue
		}
		vs := vals[: n-1 : n-1]
		vals = vals[n-1:]
		for j := range vs {
			vs[j] = str()
		}
		h[k] = vs
	}
	return h
}

var _ Journal = (*MemoryJournal)(nil)

// NewMemoryJournal returns an empty in-memory journal that accepts request
// bodies up to DefaultMaxBodySize.
func NewMemoryJournal() *MemoryJournal {
	return &MemoryJournal{
		maxBody: DefaultMaxBodySize,
		now:     time.Now,
		byKey:   make(map[string]*memEntry),
		byOp:    make(map[scopeID]*memEntry),
		live:    make(map[string]bool),
		gone:    make(map[string]bool),
	}
}

// MaxBodySize is the largest request body the journal accepts.
func (m *MemoryJournal) MaxBodySize() int { return m.maxBody }

// ownerGone reports whether owner registered and then unregistered. The
// caller holds m.mu.
func (m *MemoryJournal) ownerGone(owner string) bool { return m.gone[owner] }

func (m *MemoryJournal) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrJournalClosed
	}
	return nil
}

// Create implements Journal.
func (m *MemoryJournal) Create(ctx context.Context, rec Record) (Record, bool, error) {
	return m.create(ctx, rec, false, false, false)
}

// createShared is the client's Create (see createRecord): the record it
// returns when it creates one is the stored one, not a copy; with
// keepHeader its Header is rec's, with keepBody its Body.
func (m *MemoryJournal) createShared(ctx context.Context, rec Record, keepHeader, keepBody bool) (Record, bool, error) {
	return m.create(ctx, rec, true, keepHeader, keepBody)
}

func (m *MemoryJournal) create(ctx context.Context, rec Record, share, keepHeader, keepBody bool) (Record, bool, error) {
	header, body := rec.Header, rec.Body
	if keepHeader {
		rec.Header = nil // kept, not copied, once the record is valid
	}
	keepBody = keepBody && len(body) <= m.maxBody // else NewRecord refuses it
	if keepBody {
		rec.Body = nil
	}
	out, ev, err := journal.NewRecord(rec, m.now(), m.maxBody)
	if err != nil {
		return Record{}, false, err
	}
	if keepHeader && len(header) > 0 {
		out.Header = header
	}
	if keepBody && len(body) > 0 {
		out.Body = body
	}
	stored := out
	stored.Header = nil
	l := memLives.Get().(*memLive)
	l.rec, l.events[0] = stored, ev
	if keepHeader {
		// The client's own map, which nothing changes: packed with the
		// record when it settles, not into bytes of its own before.
		l.header = memHeader{m: header}
	} else {
		l.header = packedAs(packHeader(out.Header))
	}
	l.history = l.events[:1]
	e := &memEntry{live: l}
	if err := m.lock(ctx); err != nil {
		return Record{}, false, err
	}
	if e, ok := m.byOp[scopeID{rec.Scope, rec.ID}]; ok {
		s := e.stored()
		m.mu.Unlock()
		existing := s.copy()
		if existing.Fingerprint != rec.Fingerprint {
			return existing, false, journal.FingerprintMismatch(existing)
		}
		return existing, false, nil
	}
	e.seq = m.seq + 1
	// The key is stored without a lookup first, one hashing of it less
	// per Create: a map that did not grow had it already, under another
	// operation, which is put back (a scan, for a refused Create only).
	n := len(m.byKey)
	m.byKey[out.Key] = e
	if len(m.byKey) == n {
		for _, other := range m.byOp {
			if other.record().Key == out.Key {
				m.byKey[out.Key] = other
				break
			}
		}
		m.mu.Unlock()
		return Record{}, false, fmt.Errorf("%w: %s", ErrDuplicateKey, out.Key)
	}
	m.seq++
	m.byOp[scopeID{out.Scope, out.ID}] = e
	m.mu.Unlock()
	if share {
		return out, true, nil
	}
	return journal.CloneRecord(out), true, nil
}

// Get implements Journal.
func (m *MemoryJournal) Get(ctx context.Context, key string) (Record, error) {
	if err := m.lock(ctx); err != nil {
		return Record{}, err
	}
	e, ok := m.byKey[key]
	var s memStored
	if ok {
		s = e.stored()
	}
	m.mu.Unlock()
	if !ok {
		return Record{}, journal.NotFound("key " + key)
	}
	return s.copy(), nil
}

// Lookup implements Journal.
func (m *MemoryJournal) Lookup(ctx context.Context, scope, id string) (Record, error) {
	if err := m.lock(ctx); err != nil {
		return Record{}, err
	}
	e, ok := m.byOp[scopeID{scope, id}]
	var s memStored
	if ok {
		s = e.stored()
	}
	m.mu.Unlock()
	if !ok {
		return Record{}, journal.NotFound(scope + "/" + id)
	}
	return s.copy(), nil
}

// Update implements Journal. Durability is ignored: nothing is durable here.
func (m *MemoryJournal) Update(ctx context.Context, rec Record, d Durability, why Event) (Record, error) {
	out, header, err := m.update(ctx, rec, d, why)
	if err != nil {
		return Record{}, err
	}
	out = journal.CloneRecord(out)
	out.Header = header.header()
	if out.Response != nil {
		out.Response.Header = cloneHeaderOf(rec.Response)
	}
	return out, nil
}

// updateShared is the client's Update (see createRecord): the record it
// returns shares its request with the stored one, and its Response is
// rec's own (the stored one is a copy of it).
func (m *MemoryJournal) updateShared(ctx context.Context, rec Record, d Durability, why Event) (Record, error) {
	out, _, err := m.update(ctx, rec, d, why)
	if err != nil {
		return Record{}, err
	}
	// The request is the client's record's, as stored: its header is the
	// one the client has.
	out.Header = rec.Header
	if out.Response != nil && rec.Response != nil {
		// The stored Response is a copy of rec's, field for field (the
		// rules' cloneResponse): rec's is the same answer.
		out.Response = rec.Response
	}
	return out, nil
}

// cloneHeaderOf returns a copy of r's header.
func cloneHeaderOf(r *Response) http.Header {
	if r == nil || len(r.Header) == 0 {
		return nil
	}
	return r.Header.Clone()
}

// update stores rec's write and returns the stored record, which the
// caller must copy before handing it on, and whose Response, if any, has
// no Header: rec's is the one stored (packed); nor has its request, whose
// Header update returns packed.
func (m *MemoryJournal) update(ctx context.Context, rec Record, d Durability, why Event) (Record, memHeader, error) {
	if err := journal.CheckDurability(d); err != nil {
		return Record{}, memHeader{}, err
	}
	// The rules copy the rest of the response; its header and body are
	// copied by wrote, into the form the record is kept in.
	answer := rec.Response
	if answer != nil {
		resp := *answer
		resp.Header, resp.Body = nil, nil
		rec.Response = &resp
	}
	for {
		if err := m.lock(ctx); err != nil {
			return Record{}, memHeader{}, err
		}
		e, ok := m.byKey[rec.Key]
		if !ok {
			m.mu.Unlock()
			return Record{}, memHeader{}, journal.NotFound("key " + rec.Key)
		}
		if rec.Lease.Owner == "" {
			// An unleased write's rules ask whether the lease's owner
			// is gone, which the lock guards.
			stored, header, _ := e.stored().record()
			out, ev, err := journal.ApplyUpdate(stored, rec, m.now(), why, m.ownerGone)
			if err == nil {
				m.store(e, out, ev, answer)
			}
			m.mu.Unlock()
			if err != nil {
				return Record{}, memHeader{}, err
			}
			return out, header, nil
		}
		s, gen := e.stored(), e.gen
		// The history of a live record, copied: packed with the write
		// below if it settles the record (the live form goes back to the
		// pool once a write settles it, so it is read under the lock).
		var room [2]Event
		var history []Event
		if e.live != nil {
			history = append(room[:0], e.live.history...)
		}
		m.mu.Unlock()
		// A leased write's rules need nothing but the stored record.
		stored, header, _ := s.record()
		out, ev, err := journal.ApplyUpdate(stored, rec, m.now(), why, nil)
		if err != nil {
			return Record{}, memHeader{}, err
		}
		// A write that settles a live record (a call's outcome) packs it
		// here too, before the lock: every other caller waits for the
		// lock, which then only swaps the packed record in.
		var settled packedSettle
		if s.packed == nil && out.State.Terminal() {
			settled = packSettle(out, s.header, answer, append(history, ev))
		}
		if err := m.lock(ctx); err != nil {
			return Record{}, memHeader{}, err
		}
		if m.byKey[rec.Key] != e || e.gen != gen {
			m.mu.Unlock()
			continue // written (or pruned) meanwhile: judge the write again
		}
		if !settled.ok {
			m.store(e, out, ev, answer)
			m.mu.Unlock()
			return out, header, nil
		}
		l := e.live // s's, as nothing wrote e since (gen)
		e.settle(out, settled)
		m.mu.Unlock()
		// Nothing holds l now: readers copy its fields, and its history
		// only under the lock.
		*l = memLive{}
		memLives.Put(l)
		if out.Response != nil {
			out.Response.Body = e.respBody
		}
		return out, header, nil
	}
}

// store stores out, an Update's record, with ev, in e. answer is out's
// Response as the writer gave it (see wrote): out.Response gets the body
// stored. The caller holds m.mu.
func (m *MemoryJournal) store(e *memEntry, out Record, ev Event, answer *Response) {
	l := e.open()
	l.rec, l.respHeader = out, nil
	l.history = append(l.history, ev)
	body := e.wrote(l, answer)
	if out.Response != nil {
		out.Response.Body = body
	}
}

// Claim implements Journal.
func (m *MemoryJournal) Claim(ctx context.Context, req ClaimRequest) ([]Record, error) {
	if err := journal.CheckClaimRequest(req); err != nil {
		return nil, err
	}
	if err := m.lock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	now := m.now()
	var due []*memEntry
	for _, e := range m.byKey {
		l := e.live
		if l == nil {
			continue // packed: settled, never claimable
		}
		if journal.Claimable(l.rec, now, req.DueBy, m.ownerGone) && (req.Scope == "" || l.rec.Scope == req.Scope) &&
			strings.HasPrefix(l.rec.URL, req.URLPrefix) {
			due = append(due, e)
		}
	}
	slices.SortFunc(due, func(a, b *memEntry) int {
		return cmp.Or(a.live.rec.NextAttemptAt.Compare(b.live.rec.NextAttemptAt), cmp.Compare(a.seq, b.seq))
	})
	var out []Record
	for _, e := range due[:min(len(due), req.Limit)] {
		l := e.live
		rec, ev, err := journal.ApplyClaim(l.rec, req.Owner, req.Lease, now, m.ownerGone)
		if err != nil {
			return nil, err
		}
		l.rec = rec
		l.history = append(l.history, ev)
		out = append(out, copyOf(rec, l.header, l.respHeader))
		e.wrote(l, nil)
	}
	return out, nil
}

// Acquire implements Journal.
func (m *MemoryJournal) Acquire(ctx context.Context, key, owner string, lease time.Duration) (Record, error) {
	if err := m.lock(ctx); err != nil {
		return Record{}, err
	}
	defer m.mu.Unlock()
	e, ok := m.byKey[key]
	if !ok {
		return Record{}, journal.NotFound("key " + key)
	}
	s := e.stored()
	stored, header, resp := s.record()
	rec, ev, err := journal.ApplyClaim(stored, owner, lease, m.now(), m.ownerGone)
	if err != nil {
		return copyOf(stored, header, resp), err
	}
	l := e.open()
	l.rec = rec
	l.history = append(l.history, ev)
	e.wrote(l, nil)
	return copyOf(rec, header, resp), nil
}

// Renew implements Journal.
func (m *MemoryJournal) Renew(ctx context.Context, held map[string]Lease, lease time.Duration) (int, error) {
	if err := m.lock(ctx); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	now := m.now()
	n := 0
	for key, l := range held {
		e, ok := m.byKey[key]
		if !ok {
			continue
		}
		if rec, renewed := journal.ApplyRenew(e.record(), l, lease, now); renewed {
			live := e.open()
			live.rec = rec
			e.wrote(live, nil)
			n++
		}
	}
	return n, nil
}

// Register implements Journal: the owner is gone once it unregisters.
func (m *MemoryJournal) Register(ctx context.Context, owner string) (func() error, error) {
	if owner == "" {
		return nil, fmt.Errorf("%w: Register needs an owner name", ErrInvalidRecord)
	}
	if err := m.lock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	if m.live[owner] || m.gone[owner] {
		return nil, fmt.Errorf("%w: owner %q registered before; each registration needs a new name", ErrInvalidRecord, owner)
	}
	m.live[owner] = true
	var once sync.Once
	return func() error {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			delete(m.live, owner)
			m.gone[owner] = true
		})
		return nil
	}, nil
}

// Sync implements Journal; nothing here is ever durable.
func (m *MemoryJournal) Sync(ctx context.Context) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	m.mu.Unlock()
	return nil
}

// Release implements Journal.
func (m *MemoryJournal) Release(ctx context.Context, key string, l Lease) error {
	if err := m.lock(ctx); err != nil {
		return err
	}
	defer m.mu.Unlock()
	e, ok := m.byKey[key]
	if !ok {
		return journal.NotFound("key " + key)
	}
	rec, err := journal.ApplyRelease(e.record(), l, m.now())
	if err != nil {
		return err
	}
	live := e.open()
	live.rec = rec
	e.wrote(live, nil)
	return nil
}

// List implements Journal. It takes the matching records under the lock,
// which is what memory allows, and copies each as it yields it.
func (m *MemoryJournal) List(ctx context.Context, f Filter) iter.Seq2[Record, error] {
	return func(yield func(Record, error) bool) {
		if err := m.lock(ctx); err != nil {
			yield(Record{}, err)
			return
		}
		var after int64 = -1
		if f.After != "" {
			e, ok := m.byKey[f.After]
			if !ok {
				m.mu.Unlock()
				yield(Record{}, journal.CursorNotFound(f.After))
				return
			}
			after = e.seq
		}
		// A packed record is found as its slices; a live one, rare in a
		// journal that keeps what settled, as a copy of its own.
		type found struct {
			seq                    int64
			packed, body, respBody []byte
			live                   *memStored
		}
		stored := func(seq int64, s memStored) found {
			if s.packed != nil {
				return found{seq: seq, packed: s.packed, body: s.body, respBody: s.respBody}
			}
			return found{seq: seq, live: &s}
		}
		// With none of Filter.Match's conditions, every record matches:
		// a packed one is unpacked once, as it is copied.
		all := f.Scope == "" && f.CreatedBefore.IsZero() && len(f.States) == 0
		var match []found
		if all {
			match = make([]found, 0, len(m.byKey))
		}
		for _, e := range m.byKey {
			if e.seq <= after {
				continue
			}
			s := e.stored()
			if all {
				match = append(match, stored(e.seq, s))
				continue
			}
			if rec, header, resp := s.record(); f.Match(rec) {
				match = append(match, stored(e.seq, memStored{rec: rec, header: header, respHeader: resp}))
			}
		}
		m.mu.Unlock()
		// What was found is never changed in place: it is copied for
		// the caller after the lock.
		slices.SortFunc(match, func(a, b found) int { return cmp.Compare(a.seq, b.seq) })
		for _, x := range match {
			s := memStored{packed: x.packed, body: x.body, respBody: x.respBody}
			if x.live != nil {
				s = *x.live
			}
			r := s.copy()
			if err := ctx.Err(); err != nil {
				yield(Record{}, err)
				return
			}
			if !yield(r, nil) {
				return
			}
		}
	}
}

// Count implements Journal.
func (m *MemoryJournal) Count(ctx context.Context) ([]Count, error) {
	if err := m.lock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	type group struct {
		scope string
		state State
	}
	counts := map[group]*Count{}
	for _, e := range m.byKey {
		rec := e.record()
		g := group{rec.Scope, rec.State}
		c, ok := counts[g]
		if !ok {
			c = &Count{Scope: g.scope, State: g.state, Oldest: rec.CreatedAt}
			counts[g] = c
		}
		c.N++
		if rec.CreatedAt.Before(c.Oldest) {
			c.Oldest = rec.CreatedAt
		}
	}
	out := make([]Count, 0, len(counts))
	for _, c := range counts {
		out = append(out, *c)
	}
	journal.SortCounts(out)
	return out, nil
}

// History implements Journal.
func (m *MemoryJournal) History(ctx context.Context, key string) ([]Event, error) {
	if err := m.lock(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	e, ok := m.byKey[key]
	if !ok {
		return nil, journal.NotFound("key " + key)
	}
	return e.historyCopy(), nil
}

// Prune implements Journal.
func (m *MemoryJournal) Prune(ctx context.Context, before time.Time) (int, error) {
	if err := m.lock(ctx); err != nil {
		return 0, err
	}
	defer m.mu.Unlock()
	n := 0
	for k, e := range m.byKey {
		if rec := e.record(); journal.Prunable(rec, before) {
			delete(m.byKey, k)
			delete(m.byOp, scopeID{rec.Scope, rec.ID})
			n++
		}
	}
	return n, nil
}

// Close implements Journal.
func (m *MemoryJournal) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}
