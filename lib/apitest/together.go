package apitest

import "sync"

// StartTogether runs f(0..n-1) in n goroutines released together by one
// start gate, and waits for all of them: every call is at its start line
// before any begins, so the calls meet in the database rather than one
// after another as their goroutines happen to start.
func StartTogether(n int, f func(i int)) {
	start := make(chan struct{})
	var ready, done sync.WaitGroup
	ready.Add(n)
	for i := range n {
		done.Go(func() {
			ready.Done()
			<-start
			f(i)
		})
	}
	ready.Wait()
	close(start)
	done.Wait()
}
