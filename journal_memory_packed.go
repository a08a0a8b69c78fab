package idem

import (
	"encoding/binary"
	"net/http"
	"time"

	"github.com/idemkit/idem/journal"
)

// A MemoryJournal keeps every record it was given until Prune, settled ones
// by far the most. As a Record and its history, one is a few objects with
// pointers (the entry, its strings, its Response, its events' strings),
// which every garbage collection of the process marks again; packed into
// one byte slice (packRecord), with its bodies in their own, it is three
// objects none of which is scanned. Reads of a settled record, rarer than
// the writes that made it, unpack it into a fresh Record.

// memPacker appends a record's fields to a byte slice.
type memPacker []byte

func (p *memPacker) uint(v uint64) { *p = binary.AppendUvarint(*p, v) }
func (p *memPacker) int(v int64)   { *p = binary.AppendVarint(*p, v) }
func (p *memPacker) byte(v byte)   { *p = append(*p, v) }
func (p *memPacker) str(s string)  { p.uint(uint64(len(s))); *p = append(*p, s...) }

func (p *memPacker) bool(v bool) {
	if v {
		p.byte(1)
	} else {
		p.byte(0)
	}
}

// The forms of a packed time: its location is all a time.Time holds
// besides its instant, and the journal's times (journal.TruncateTime) are
// Local ones without a monotonic reading.
const (
	packedTimeZero = iota
	packedTimeLocal
	packedTimeUTC
)

// time appends t and reports whether it reads back as t (==): a time in
// another location, or with a monotonic reading, does not.
func (p *memPacker) time(t time.Time) bool {
	if t.IsZero() {
		p.byte(packedTimeZero)
		return t == time.Time{}
	}
	form, back := byte(packedTimeLocal), time.Unix(t.Unix(), int64(t.Nanosecond()))
	if t.Location() == time.UTC {
		form, back = packedTimeUTC, back.UTC()
	}
	p.byte(form)
	p.int(t.Unix())
	p.uint(uint64(t.Nanosecond()))
	return back == t
}

// memHeader is a header as a record holds it: packed (a stored record's),
// or a writer's map (m), which nothing changes, packed straight into the
// record's bytes when it is packed rather than into bytes of its own
// first.
type memHeader struct {
	packed packedHeader
	m      http.Header
}

func packedAs(p packedHeader) memHeader { return memHeader{packed: p} }

// sizes returns h's length packed and, for a map, its count of values.
func (h memHeader) sizes() (size, values int) {
	if h.m == nil {
		return len(h.packed), 0
	}
	return packedHeaderSize(h.m)
}

// header returns a new http.Header with h's names and values, nil when
// it has none.
func (h memHeader) header() http.Header {
	if h.m == nil {
		return h.packed.header()
	}
	if len(h.m) == 0 {
		return nil
	}
	return h.m.Clone()
}

// header appends h, whose sizes are size and values, after its length.
func (p *memPacker) header(h memHeader, size, values int) {
	p.uint(uint64(size))
	if h.m == nil {
		*p = append(*p, h.packed...)
		return
	}
	*p = appendHeader(*p, h.m, values)
}

// packRecord returns rec, whose request header is header and whose
// Response's is resp, and its history, in one byte slice, and false if
// some time of theirs would not read back as it is (the caller then keeps
// the record as it is). The bodies are left out (the entry holds them),
// but for respBody, a Response's body the record has no copy of yet:
// appended to the slice, whose part it is is returned as body (nil when
// it is empty), so that a settled record with a new answer is one
// allocation.
func packRecord(rec Record, header, resp memHeader, respBody []byte, history []Event) (packed, body []byte, ok bool) {
	headerSize, headerValues := header.sizes()
	respSize, respValues := resp.sizes()
	size := 96 + len(rec.Key) + len(rec.Scope) + len(rec.ID) + len(rec.Method) + len(rec.URL) +
		len(rec.Fingerprint) + len(rec.KeyHeader) + len(rec.Lease.Owner) + len(rec.LastError) +
		len(rec.Note) + len(rec.Link) + headerSize + respSize + len(respBody)
	for _, ev := range history {
		size += 40 + len(ev.Detail) + len(ev.Error) + len(ev.Owner)
	}
	p := make(memPacker, 0, size)
	p.str(rec.Key)
	p.str(rec.Scope)
	p.str(rec.ID)
	p.str(rec.Method)
	p.str(rec.URL)
	p.header(header, headerSize, headerValues)
	p.str(rec.Fingerprint)
	p.str(rec.KeyHeader)
	p.bool(rec.KeyQuoted)
	p.byte(byte(rec.State))
	p.int(int64(rec.Attempts))
	p.int(int64(rec.TransportResends))
	ok = p.time(rec.NextAttemptAt)
	p.str(rec.Lease.Owner)
	p.int(rec.Lease.Epoch)
	ok = p.time(rec.Lease.ExpiresAt) && ok
	p.bool(rec.Response != nil)
	if r := rec.Response; r != nil {
		p.int(int64(r.StatusCode))
		p.header(resp, respSize, respValues)
		p.bool(r.Replayed)
	}
	p.str(rec.LastError)
	p.str(rec.Note)
	p.str(rec.Link)
	ok = p.time(rec.CreatedAt) && ok
	ok = p.time(rec.UpdatedAt) && ok
	ok = p.time(rec.ExpiresAt) && ok
	p.int(rec.Version)
	p.uint(uint64(len(history)))
	for _, ev := range history {
		p.int(ev.Version)
		ok = p.time(ev.At) && ok
		p.byte(byte(ev.Kind))
		p.str(ev.Detail)
		p.byte(byte(ev.From))
		p.byte(byte(ev.To))
		p.int(int64(ev.Attempt))
		p.int(int64(ev.StatusCode))
		p.str(ev.Error)
		p.str(ev.Owner)
	}
	if len(respBody) > 0 {
		at := len(p)
		p = append(p, respBody...)
		body = p[at:len(p):len(p)]
	}
	return p, body, ok
}

// memUnpacker reads what memPacker wrote in b; its strings are slices of
// s, one string of b's bytes.
type memUnpacker struct {
	b []byte
	s string
	i int
}

func (u *memUnpacker) uint() uint64 {
	v, n := binary.Uvarint(u.b[u.i:])
	u.i += n
	return v
}

func (u *memUnpacker) int() int64 {
	v, n := binary.Varint(u.b[u.i:])
	u.i += n
	return v
}

func (u *memUnpacker) byte() byte { u.i++; return u.b[u.i-1] }
func (u *memUnpacker) bool() bool { return u.byte() == 1 }

func (u *memUnpacker) str() string {
	n := int(u.uint())
	u.i += n
	return u.s[u.i-n : u.i]
}

func (u *memUnpacker) time() time.Time {
	form := u.byte()
	if form == packedTimeZero {
		return time.Time{}
	}
	t := time.Unix(u.int(), int64(u.uint()))
	if form == packedTimeUTC {
		t = t.UTC()
	}
	return t
}

// unpackRecord returns the record packRecord packed in p, with body and
// respBody as its bodies and no header (header and resp are its packed
// ones, slices of p), and with withHistory its history too.
func unpackRecord(p, body, respBody []byte, withHistory bool) (rec Record, header, resp packedHeader, history []Event) {
	u := memUnpacker{b: p, s: string(p)}
	// The headers stay bytes, slices of p.
	headerAt := func() packedHeader {
		n := int(u.uint())
		u.i += n
		if n == 0 {
			return nil
		}
		return p[u.i-n : u.i : u.i]
	}
	rec.Key = u.str()
	rec.Scope = u.str()
	rec.ID = u.str()
	rec.Method = u.str()
	rec.URL = u.str()
	header = headerAt()
	rec.Body = body
	rec.Fingerprint = u.str()
	rec.KeyHeader = u.str()
	rec.KeyQuoted = u.bool()
	rec.State = journal.State(u.byte())
	rec.Attempts = int(u.int())
	rec.TransportResends = int(u.int())
	rec.NextAttemptAt = u.time()
	rec.Lease.Owner = u.str()
	rec.Lease.Epoch = u.int()
	rec.Lease.ExpiresAt = u.time()
	if u.bool() {
		r := &Response{StatusCode: int(u.int())}
		resp = headerAt()
		r.Replayed = u.bool()
		r.Body = respBody
		rec.Response = r
	}
	rec.LastError = u.str()
	rec.Note = u.str()
	rec.Link = u.str()
	rec.CreatedAt = u.time()
	rec.UpdatedAt = u.time()
	rec.ExpiresAt = u.time()
	rec.Version = u.int()
	if !withHistory {
		return rec, header, resp, nil
	}
	history = make([]Event, u.uint())
	for i := range history {
		ev := &history[i]
		ev.Version = u.int()
		ev.At = u.time()
		ev.Kind = journal.EventKind(u.byte())
		ev.Detail = u.str()
		ev.From = journal.State(u.byte())
		ev.To = journal.State(u.byte())
		ev.Attempt = int(u.int())
		ev.StatusCode = int(u.int())
		ev.Error = u.str()
		ev.Owner = u.str()
	}
	return rec, header, resp, history
}
