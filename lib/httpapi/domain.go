package httpapi

import (
	"github.com/getratchet/ratchet/lib/gate"
	"github.com/getratchet/ratchet/lib/jobs"
	"github.com/getratchet/ratchet/lib/webhooks"
)

// Domain holds the domain services the routes call. Each feature adds its
// service here and its routes in routes_<feature>.go.
type Domain struct {
	Gate     *gate.Service
	Jobs     *jobs.Service
	Webhooks *webhooks.Service
}
