// Command benchratio reads the output of `go test -bench` from several
// processes, one file each, and prints every benchmark's metrics as the
// median over the runs, then ratios between benchmarks computed within each
// run and given as the median of the per-run ratios, with the lowest and
// highest in brackets. A run is one file, or the k-th result of each
// benchmark in a file that holds several (-count).
//
//	benchratio -ratio idem:naive -ratio memory:plain -added idem/callers=1:plain/callers=1:fsync run*.txt
//
// -ratio A:B divides the metric (-metric, ops/s by default) of every
// benchmark that has a name element A by that of the benchmark whose name
// is the same with B in its place: idem:naive pairs BenchmarkSpeed/idem/callers=1
// with BenchmarkSpeed/naive/callers=1. -added A:B:C gives (ns/op of A − ns/op
// of B) ÷ ns/op of C, names taken after the benchmark function's: in a
// closed loop with one caller, ns/op is the mean latency of a call, so this
// is A's added latency over B in units of C.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

// result is one benchmark's metrics in one run, by unit.
type result map[string]float64

// data holds, per benchmark name (without the -GOMAXPROCS suffix), the
// results of each run, keyed by run.
type data struct {
	names []string // in order of first appearance
	units []string // in order of first appearance
	runs  []string // run labels, in order
	res   map[string]map[string]result
}

var procs = regexp.MustCompile(`-\d+$`)

func main() {
	var ratios, added multi
	metric := flag.String("metric", "ops/s", "the metric -ratio divides")
	flag.Var(&ratios, "ratio", "A:B, name elements (repeatable)")
	flag.Var(&added, "added", "A:B:C, sub-benchmark names (repeatable)")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: benchratio [-metric unit] [-ratio A:B]... [-added A:B:C]... file...")
		os.Exit(2)
	}
	d := &data{res: map[string]map[string]result{}}
	for _, path := range flag.Args() {
		f, err := os.Open(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		err = d.read(f, path)
		f.Close()
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			os.Exit(1)
		}
	}
	d.printMedians(os.Stdout)
	for _, r := range ratios {
		a, b, ok := strings.Cut(r, ":")
		if !ok {
			fmt.Fprintf(os.Stderr, "-ratio %q: want A:B\n", r)
			os.Exit(2)
		}
		d.printRatio(os.Stdout, a, b, *metric)
	}
	for _, s := range added {
		p := strings.Split(s, ":")
		if len(p) != 3 {
			fmt.Fprintf(os.Stderr, "-added %q: want A:B:C\n", s)
			os.Exit(2)
		}
		d.printAdded(os.Stdout, p[0], p[1], p[2])
	}
}

// read adds one file's results; the k-th result of a benchmark in it
// belongs to run path#k.
func (d *data) read(r io.Reader, path string) error {
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		if _, err := strconv.Atoi(f[1]); err != nil {
			continue
		}
		name := procs.ReplaceAllString(f[0], "")
		run := fmt.Sprintf("%s#%d", path, seen[name])
		seen[name]++
		if !slices.Contains(d.runs, run) {
			d.runs = append(d.runs, run)
		}
		if d.res[name] == nil {
			d.res[name] = map[string]result{}
			d.names = append(d.names, name)
		}
		res := result{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return fmt.Errorf("%s: %v", f[0], err)
			}
			res[f[i+1]] = v
			if !slices.Contains(d.units, f[i+1]) {
				d.units = append(d.units, f[i+1])
			}
		}
		d.res[name][run] = res
	}
	return sc.Err()
}

// stats returns the median, lowest and highest of xs, which it sorts.
func stats(xs []float64) (med, lo, hi float64) {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		med = xs[n/2]
	} else {
		med = (xs[n/2-1] + xs[n/2]) / 2
	}
	return med, xs[0], xs[n-1]
}

func (d *data) printMedians(w io.Writer) {
	fmt.Fprintf(w, "Medians of %d runs\n\n| benchmark | %s |\n|---|", len(d.runs), strings.Join(d.units, " | "))
	fmt.Fprintln(w, strings.Repeat("---|", len(d.units)))
	for _, name := range d.names {
		fmt.Fprintf(w, "| %s |", name)
		for _, u := range d.units {
			var xs []float64
			for _, res := range d.res[name] {
				if v, ok := res[u]; ok {
					xs = append(xs, v)
				}
			}
			if len(xs) == 0 {
				fmt.Fprint(w, " |")
				continue
			}
			med, _, _ := stats(xs)
			fmt.Fprintf(w, " %s |", num(med))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w)
}

// num prints v with three significant digits or as a whole number.
func num(v float64) string {
	if v >= 1000 || v <= -1000 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func (d *data) printRatio(w io.Writer, a, b, unit string) {
	for _, name := range d.names {
		el := strings.Split(name, "/")
		i := slices.Index(el, a)
		if i < 0 {
			continue
		}
		el[i] = b
		other := strings.Join(el, "/")
		var xs []float64
		for _, run := range d.runs {
			x, ok1 := d.res[name][run][unit]
			y, ok2 := d.res[other][run][unit]
			if ok1 && ok2 && y != 0 {
				xs = append(xs, x/y)
			}
		}
		if len(xs) == 0 {
			continue
		}
		el[i] = a + "÷" + b
		med, lo, hi := stats(xs)
		fmt.Fprintf(w, "%s (%s): %.2f× [%.2f–%.2f] of %d runs\n", strings.Join(el, "/"), unit, med, lo, hi, len(xs))
	}
}

func (d *data) printAdded(w io.Writer, a, b, c string) {
	find := func(sub string) string {
		for _, name := range d.names {
			if _, rest, ok := strings.Cut(name, "/"); ok && rest == sub {
				return name
			}
		}
		return ""
	}
	na, nb, nc := find(a), find(b), find(c)
	if na == "" || nb == "" || nc == "" {
		fmt.Fprintf(w, "added %s over %s in %s: not all found\n", a, b, c)
		return
	}
	var xs, us []float64
	for _, run := range d.runs {
		x, ok1 := d.res[na][run]["ns/op"]
		y, ok2 := d.res[nb][run]["ns/op"]
		z, ok3 := d.res[nc][run]["ns/op"]
		if ok1 && ok2 && ok3 && z != 0 {
			xs = append(xs, (x-y)/z)
			us = append(us, (x-y)/1000)
		}
	}
	if len(xs) == 0 {
		return
	}
	med, lo, hi := stats(xs)
	mu, _, _ := stats(us)
	fmt.Fprintf(w, "added latency of %s over %s: %.0f µs = %.2f× [%.2f–%.2f] %s, of %d runs\n", a, b, mu, med, lo, hi, c, len(xs))
}
