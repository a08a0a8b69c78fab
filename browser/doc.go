// Package browser tests idem ui in a real browser: the real idem binary,
// serving a real SQLite journal, driven in headless Chromium with
// chromedp. It is a module of its own so that the root module never
// depends on chromedp.
//
// The tests skip, saying so, when chromium is not installed; .ci/run
// installs it. Screenshots of the main pages are written to a temporary
// directory that the test logs (run with -v to see it).
package browser
