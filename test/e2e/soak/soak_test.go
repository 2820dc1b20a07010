package soak

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// Rhythm of the soak.
const (
	checkEvery = time.Second
	// A case is created every createMin..createMax while fewer than
	// maxActive live.
	createMin, createMax = 2 * time.Second, 6 * time.Second
	maxActive            = 24
	// A fault starts faultGapMin..faultGapMax after the last one ended.
	faultGapMin, faultGapMax = 15 * time.Second, 45 * time.Second
	// sweepAfter: a pod on a fake node still being deleted after this is
	// deleted at once, as its kubelet would confirm.
	sweepAfter = 5 * time.Second
	// settleEnd bounds how long the workload may take to go once deleted.
	settleEnd = 3 * time.Minute
	// unconsumedLimit is invariant 2's limit; waitingSlack is added to
	// the bind timeout for invariant 3's.
	unconsumedLimit = time.Minute
	waitingSlack    = 30 * time.Second
)

// recorder keeps the timeline and the counts of one run.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	lines []string
	// counts
	cases        map[caseKind]int
	createFailed int
	deleted      int
	faults       map[faultKind]int
	faultErrors  []string
	skipped      int // views that could not be listed (the API server was away)
	// controllerStarts counts the times superviseController started the
	// controller after it had ended on its own; controllerStartsFailed
	// those that failed (the API server still away).
	controllerStarts, controllerStartsFailed int
	bound                                    map[types.UID]bool
}

func newRecorder() *recorder {
	return &recorder{start: time.Now(), cases: map[caseKind]int{}, faults: map[faultKind]int{}, bound: map[types.UID]bool{}}
}

// event adds a line to the timeline; the log has every line.
func (r *recorder) event(format string, args ...any) {
	line := fmt.Sprintf("[%7.1fs %s] %s", time.Since(r.start).Seconds(), time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
	r.mu.Lock()
	r.lines = append(r.lines, line)
	r.mu.Unlock()
	fmt.Println("soak event: " + line)
}

// tail is the timeline's last n lines.
func (r *recorder) tail(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lines[max(0, len(r.lines)-n):])
}

func say(format string, args ...any) {
	for _, line := range strings.Split(fmt.Sprintf(format, args...), "\n") {
		fmt.Println("soak: " + line)
	}
}

// settings reads the run's duration and seed from the environment.
func settings() (time.Duration, uint64, error) {
	d, err := time.ParseDuration(os.Getenv(envDuration))
	if err != nil || d <= 0 {
		return 0, 0, fmt.Errorf("%s=%q: want a positive duration such as 20m", envDuration, os.Getenv(envDuration))
	}
	seed := uint64(1)
	if s := os.Getenv(envSeed); s != "" {
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			return 0, 0, fmt.Errorf("%s=%q: want a non-negative integer", envSeed, s)
		}
	}
	return d, seed, nil
}

// TestSoak runs the workload and the faults for the configured time,
// checking the invariants every second, then deletes the workload and
// checks that nothing stays allocated.
func TestSoak(t *testing.T) {
	if suite == nil {
		t.Skipf("no cluster: set %s (make soak) to run the soak", envDuration)
	}
	duration, seed, err := settings()
	if err != nil {
		t.Fatal(err)
	}
	client := suite.Client
	namespaces := append([]string{namespace}, otherNamespaces...)
	if err := setupNamespaces(client); err != nil {
		t.Fatal(err)
	}
	bind, _ := time.ParseDuration(bindTimeout)
	reserved, _ := time.ParseDuration(reservationTimeout)
	lim := limits{unconsumed: unconsumedLimit, waiting: bind + waitingSlack, reserved: reserved, clash: bind + waitingSlack}
	classes, err := client.ResourceV1().DeviceClasses().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatalf("list DeviceClasses: %v", err)
	}
	fake := map[string]bool{}
	for _, n := range suite.Nodes {
		fake[n.Name] = !n.Real
	}

	rec := newRecorder()
	chk := newChecker(lim)
	say("seed %d, %s of workload and faults on %d nodes; limits: unconsumed claim %s, waiting pod %s (+%s behind a reservation)",
		seed, duration, len(suite.Nodes), lim.unconsumed, lim.waiting, lim.reserved)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// chkMu guards the checker, whose counts the progress lines read, and
	// the first breach.
	var chkMu sync.Mutex
	var first *breach
	found := func(b *breach) {
		chkMu.Lock()
		defer chkMu.Unlock()
		if first == nil {
			first = b
			rec.event("BREACH of invariant %d", b.invariant)
			cancel()
		}
	}
	breached := func() bool {
		chkMu.Lock()
		defer chkMu.Unlock()
		return first != nil
	}

	// The checker and the sweeper run until the very end; the workload
	// and the faults until the duration is up.
	checkCtx, stopChecks := context.WithCancel(ctx)
	var checking sync.WaitGroup
	checking.Go(func() {
		tick := time.NewTicker(checkEvery)
		defer tick.Stop()
		for {
			select {
			case <-checkCtx.Done():
				return
			case <-tick.C:
			}
			v, err := look(checkCtx, client, classes.Items)
			if err != nil {
				rec.mu.Lock()
				rec.skipped++
				rec.mu.Unlock()
				continue
			}
			rec.mu.Lock()
			for i := range v.pods {
				if v.pods[i].Spec.NodeName != "" {
					rec.bound[v.pods[i].UID] = true
				}
			}
			rec.mu.Unlock()
			sweep(checkCtx, client, v, fake)
			chkMu.Lock()
			b := chk.check(checkCtx, v)
			chkMu.Unlock()
			if b != nil {
				found(b)
				return
			}
		}
	})

	workCtx, stopWork := context.WithTimeout(ctx, duration)
	defer stopWork()
	var working sync.WaitGroup
	var activeMu sync.Mutex
	active := map[string]*activeCase{}
	working.Go(func() {
		runWorkload(workCtx, rand.New(rand.NewPCG(seed, 1)), client, namespaces, rec, &activeMu, active)
	})
	working.Go(func() { runFaults(workCtx, rand.New(rand.NewPCG(seed, 2)), rec) })
	checking.Go(func() { superviseController(checkCtx, rec) })
	working.Go(func() {
		tick := time.NewTicker(time.Minute)
		defer tick.Stop()
		for {
			select {
			case <-workCtx.Done():
				return
			case <-tick.C:
				activeMu.Lock()
				n := len(active)
				activeMu.Unlock()
				chkMu.Lock()
				checked := chk.checks[invDevices]
				chkMu.Unlock()
				rec.mu.Lock()
				say("progress %s: %d cases created (%d live), %d faults, %d views checked, %d skipped, %d pods bound",
					time.Since(rec.start).Round(time.Second), sum(rec.cases), n, sum(rec.faults), checked, rec.skipped, len(rec.bound))
				rec.mu.Unlock()
			}
		}
	})
	working.Wait()

	// The end: delete what is left and wait until nothing is allocated,
	// checking the other invariants meanwhile.
	if !breached() {
		rec.event("workload and faults stopped; deleting the %d live cases", len(active))
		endCtx, endCancel := context.WithTimeout(ctx, settleEnd)
		for _, a := range active {
			err := wait.PollUntilContextCancel(endCtx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
				return a.c.remove(ctx, client) == nil, nil
			})
			if err != nil {
				t.Errorf("delete case %s: %v", a.c.name, err)
			}
			rec.mu.Lock()
			rec.deleted++
			rec.mu.Unlock()
		}
		var last *view
		err := wait.PollUntilContextCancel(endCtx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
			v, err := look(ctx, client, classes.Items)
			if err != nil {
				return false, nil
			}
			last = v
			return allocatedClaims(v) == "", nil
		})
		endCancel()
		chkMu.Lock()
		chk.checks[invEnd]++
		chkMu.Unlock()
		switch {
		case breached():
		case err != nil:
			what := "the claims could not be listed"
			if last != nil {
				what = fmt.Sprintf("%s after the workload was deleted, these claims are still allocated:\n%s", settleEnd, allocatedClaims(last))
			}
			found(&breach{invariant: invEnd, at: time.Now(), what: what})
		default:
			rec.event("nothing allocated after the workload was deleted")
		}
	}
	stopChecks()
	checking.Wait()

	rec.mu.Lock()
	summary := []string{
		fmt.Sprintf("summary: seed %d, ran %s (workload and faults %s)", seed, time.Since(rec.start).Round(time.Second), duration),
		fmt.Sprintf("cases created: %d (%s), %d deleted; creations refused: %d; pods bound: %d", sum(rec.cases), counts(rec.cases), rec.deleted, rec.createFailed, len(rec.bound)),
		fmt.Sprintf("faults: %d (%s); fault errors: %d", sum(rec.faults), counts(rec.faults), len(rec.faultErrors)),
		fmt.Sprintf("the controller, ended on its own (a lost leader Lease), started again %d times (%d of the starts failed, the API server still away)",
			rec.controllerStarts-rec.controllerStartsFailed, rec.controllerStartsFailed),
		fmt.Sprintf("invariant checks: %d views (1: %d, 2: %d, 3: %d, 4: %d), %d views skipped (API server away); longest wait of a pod whose group fitted: %s",
			chk.checks[invDevices], chk.checks[invDevices], chk.checks[invConsumer], chk.checks[invWaiting], chk.checks[invEnd], rec.skipped, chk.longestWait()),
	}
	nBreach := 0
	if first != nil {
		nBreach = 1
	}
	summary = append(summary, fmt.Sprintf("planner's answers for waiting groups: %s (last not judged: %s)", counts(chk.answers), chk.lastNotJudged))
	summary = append(summary, fmt.Sprintf("devices held beyond what they allow, by claims not all bound: %d seen, %d taken back within %s", chk.clashes, chk.repaired, lim.clash))
	summary = append(summary, fmt.Sprintf("breaches: %d", nBreach))
	faultErrors := slices.Clone(rec.faultErrors)
	rec.mu.Unlock()
	say("%s", strings.Join(summary, "\n"))
	for _, e := range faultErrors {
		t.Errorf("fault error: %s", e)
	}
	if first != nil {
		say("%s\nlast events:\n%s", first, strings.Join(rec.tail(40), "\n"))
		t.Fatalf("%s", first)
	}
}

func sum[K comparable](m map[K]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func counts[K ~string](m map[K]int) string {
	var out []string
	for _, k := range sortedKeys(m) {
		out = append(out, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(out, ", ")
}

// look lists what the checks read; claims first.
func look(ctx context.Context, client kubernetes.Interface, classes []resourcev1.DeviceClass) (*view, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v := &view{at: time.Now()}
	claims, err := client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	sl, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	jobs, err := client.BatchV1().Jobs("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	v.claims, v.pods, v.nodes, v.slices, v.jobs, v.classes = claims.Items, pods.Items, nodes.Items, sl.Items, jobs.Items, classes
	return v, nil
}

// setupNamespaces creates the other namespaces with the demo claim
// templates in each.
func setupNamespaces(client kubernetes.Interface) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, ns := range otherNamespaces {
		if err := suite.AddNamespace(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			return err
		}
	}
	return nil
}

// activeCase is a created case and when it is due to be deleted.
type activeCase struct {
	c      soakCase
	expire time.Time
}

// runWorkload creates a case now and then and deletes the cases whose
// time is up, until ctx ends. Cases that could not be deleted (the API
// server away) are tried again; those still live at the end are left in
// active.
func runWorkload(ctx context.Context, r *rand.Rand, client kubernetes.Interface, namespaces []string, rec *recorder, mu *sync.Mutex, active map[string]*activeCase) {
	next := time.Now()
	id := 0
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		mu.Lock()
		var due []*activeCase
		for _, a := range active {
			if now.After(a.expire) {
				due = append(due, a)
			}
		}
		n := len(active)
		mu.Unlock()
		slices.SortFunc(due, func(a, b *activeCase) int { return a.c.id - b.c.id })
		for _, a := range due {
			if err := a.c.remove(ctx, client); err != nil {
				continue // again on the next tick
			}
			mu.Lock()
			delete(active, a.c.name)
			mu.Unlock()
			rec.mu.Lock()
			rec.deleted++
			rec.mu.Unlock()
			rec.event("deleted %s/%s after %s", a.c.ns, a.c.name, a.c.lifetime)
		}
		if now.Before(next) || n-len(due) >= maxActive {
			continue
		}
		c := generate(r, id, namespaces)
		id++
		next = now.Add(createMin + time.Duration(r.Int64N(int64(createMax-createMin))))
		if err := c.create(ctx, client, suite.Templates); err != nil {
			rec.mu.Lock()
			rec.createFailed++
			rec.mu.Unlock()
			rec.event("create %s refused: %v", c, err)
			// A half-made case (a shared claim without its Job) is removed.
			_ = c.remove(ctx, client)
			continue
		}
		mu.Lock()
		active[c.name] = &activeCase{c: c, expire: time.Now().Add(c.lifetime)}
		mu.Unlock()
		rec.mu.Lock()
		rec.cases[c.kind]++
		rec.mu.Unlock()
		rec.event("created %s", c)
	}
}

// runFaults injects a fault now and then, holds it and undoes it, until
// ctx ends; a fault held then is undone before it returns.
func runFaults(ctx context.Context, r *rand.Rand, rec *recorder) {
	for {
		gap := faultGapMin + time.Duration(r.Int64N(int64(faultGapMax-faultGapMin)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(gap):
		}
		f := planFault(r, suite.Nodes)
		rec.event("fault: %s", f)
		// A fault is done and undone whole, even when the run ends meanwhile.
		opCtx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		undo, err := inject(opCtx, f)
		rec.mu.Lock()
		rec.faults[f.kind]++
		if err != nil {
			rec.faultErrors = append(rec.faultErrors, fmt.Sprintf("%s: %v", f, err))
		}
		rec.mu.Unlock()
		if err != nil {
			rec.event("fault %s failed: %v", f, err)
		} else {
			rec.event("fault %s done", f.kind)
		}
		if undo != nil {
			select {
			case <-ctx.Done():
			case <-time.After(f.hold):
			}
			if err := undo(opCtx); err != nil {
				rec.mu.Lock()
				rec.faultErrors = append(rec.faultErrors, fmt.Sprintf("undo %s: %v", f, err))
				rec.mu.Unlock()
				rec.event("undo %s failed: %v", f, err)
			} else {
				rec.event("undone: %s", f)
			}
		}
		cancel()
	}
}

// sweep deletes at once the soak's pods on fake nodes whose deletion has
// waited sweepAfter: no kubelet there confirms it.
func sweep(ctx context.Context, client kubernetes.Interface, v *view, fake map[string]bool) {
	for i := range v.pods {
		p := &v.pods[i]
		if p.Labels[labelPartOf] != partOf || p.DeletionTimestamp == nil || !fake[p.Spec.NodeName] || v.at.Sub(p.DeletionTimestamp.Time) < sweepAfter {
			continue
		}
		uid := p.UID
		_ = client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &uid}})
	}
}
