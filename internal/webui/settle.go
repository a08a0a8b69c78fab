package webui

import (
	"errors"
	"net/http"
	"net/url"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/operator"
)

// readOnly is the refusal of a POST when the view was started without
// --allow-writes.
const readOnly = "idem ui: refused: this view is read-only; it was started without --allow-writes, " +
	"so operations cannot be reconciled or canceled from it (use idem reconcile or idem cancel, " +
	"or restart idem ui with --allow-writes)"

// guardWrite checks a settling POST: the view allows writes and the form
// carries the CSRF token. It answers and returns false when not.
func (h *Handler) guardWrite(w http.ResponseWriter, r *http.Request) bool {
	if !h.cfg.AllowWrites {
		http.Error(w, readOnly, http.StatusForbidden)
		return false
	}
	if !h.checkCSRF(r) {
		refuseCSRF(w)
		return false
	}
	return true
}

// reconcile is POST /op/reconcile: key, as (succeeded or rejected), note.
func (h *Handler) reconcile(w http.ResponseWriter, r *http.Request) {
	if !h.guardWrite(w, r) {
		return
	}
	key, as, note := r.PostFormValue("key"), r.PostFormValue("as"), r.PostFormValue("note")
	state, err := operator.ParseOutcome(as)
	if errors.Is(err, operator.ErrNoOutcome) {
		err = errors.New("choose the outcome: succeeded or rejected")
	} else if err != nil {
		err = errors.New("outcome " + err.Error())
	}
	if err == nil {
		if operator.CheckNote(note) != nil {
			err = errors.New("the note is required: say what the decision is based on, such as \"matched order 9812 in the ERP\"")
		}
	}
	if err != nil {
		h.refuse(w, r, key, http.StatusBadRequest, err, as, note)
		return
	}
	h.settle(w, r, key, "reconciled", as, note, func(rec idem.Record) (string, error) {
		return operator.Reconcile(r.Context(), h.cfg.Journal, rec, state, note, h.cfg.Now())
	})
}

// cancel is POST /op/cancel: key.
func (h *Handler) cancel(w http.ResponseWriter, r *http.Request) {
	if !h.guardWrite(w, r) {
		return
	}
	key := r.PostFormValue("key")
	h.settle(w, r, key, "canceled", "", "", func(rec idem.Record) (string, error) {
		return operator.Cancel(r.Context(), h.cfg.Journal, rec, h.cfg.Now())
	})
}

// settle reads the operation, applies change and redirects to its page
// (303), or shows the page with the refusal: 409 when the rules refuse
// the change (the state, a live lease), 404 when there is no such
// operation.
func (h *Handler) settle(w http.ResponseWriter, r *http.Request, key, done, as, note string, change func(idem.Record) (string, error)) {
	rec, err := h.cfg.Journal.Get(r.Context(), key)
	if errors.Is(err, idem.ErrNotFound) {
		h.fail(w, r, http.StatusNotFound, errors.New("no operation has key "+visible(key, 100)+" in this journal (pruned?)"))
		return
	}
	if err != nil {
		h.fail(w, r, http.StatusInternalServerError, err)
		return
	}
	if _, err := change(rec); err != nil {
		h.refuse(w, r, key, http.StatusConflict, err, as, note)
		return
	}
	http.Redirect(w, r, "/op?"+url.Values{"key": {key}, "done": {done}}.Encode(), http.StatusSeeOther)
}

// refuse shows the operation's page with why the POST was refused, the
// form refilled.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, key string, code int, why error, as, note string) {
	p, pcode, err := h.opPage(r, key)
	if err != nil {
		h.fail(w, r, pcode, err)
		return
	}
	p.Error, p.As, p.NoteInput = why.Error(), as, note
	h.render(w, r, code, "op", p)
}
