package httpapi_test

import (
	"fmt"
	"net/http"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/getratchet/ratchet/lib/apitest"
)

// policyRace is a policy route hammered by racers on two instances: its
// path, the name of its expected-version field, and the body racer i
// sends in round r (each a change of its own).
type policyRace struct {
	path, expected string
	body           func(round, i int) map[string]any
}

const policyRacers, policyRounds = 12, 3

// racePolicyPuts releases the racers of each round together on the
// instances, every one with the expected version the round starts from
// (when expected is set), and checks each round's answers before the next.
func racePolicyPuts(instances []*apitest.Env, key string, race policyRace, expected bool,
	check func(round int, answers []*apitest.Response)) {
	e := instances[0]
	for round := range policyRounds {
		version := e.Must(http.StatusOK, "GET", race.path, key, nil).JSON()["version"]
		answers := make([]*apitest.Response, policyRacers)
		apitest.StartTogether(policyRacers, func(i int) {
			body := race.body(round, i)
			if expected {
				body[race.expected] = version
			}
			answers[i] = instances[i%2].Do("PUT", race.path, key, body)
		})
		check(round, answers)
	}
}

// versionOf is the version an answer carries.
func versionOf(r *apitest.Response) int { return int(r.JSON()["version"].(float64)) }

// requireReadsAs requires the policy read from path to be the answer want,
// field for field.
func requireReadsAs(t *testing.T, e *apitest.Env, key, path string, want *apitest.Response) {
	t.Helper()
	require.Equal(t, want.JSON(), e.Must(http.StatusOK, "GET", path, key, nil).JSON())
}

// Both policy PUTs racing on two instances with the expected version each
// round starts from: exactly one racer per round wins (200, the next
// version, its own change), every other is 409 version_conflict, and the
// policy reads as the winner wrote it.
func TestPolicyPutsRacingWithAnExpectedVersionHaveOneWinnerEach(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	instances := e.twoInstances()
	ep := e.endpoint("hammered")
	for name, race := range map[string]policyRace{
		"effect type": {"/api/v1/policies/hammer.type", "expected_version", func(round, i int) map[string]any {
			return map[string]any{"required_dimensions": []string{fmt.Sprint("d", round, "-", i)}}
		}},
		"endpoint": {"/api/v1/endpoints/" + ep["id"].(string) + "/policy", "expectedVersion", func(round, i int) map[string]any {
			return map[string]any{"maxConcurrent": 1 + round*policyRacers + i}
		}},
	} {
		start := versionOf(e.Must(http.StatusOK, "GET", race.path, e.ws.Key, nil))
		racePolicyPuts(instances, e.ws.Key, race, true, func(round int, answers []*apitest.Response) {
			var winner *apitest.Response
			for i, r := range answers {
				switch {
				case r.Status == http.StatusOK:
					require.Nil(t, winner, "%s round %d: a second winner, racer %d: %s", name, round, i, r.Body)
					winner = r
					require.Equal(t, start+round+1, versionOf(r), "%s round %d", name, round)
					for field, v := range race.body(round, i) {
						require.EqualValues(t, fmt.Sprint(v), fmt.Sprint(r.JSON()[field]), "%s round %d: the winner's own change", name, round)
					}
				case r.Status == http.StatusConflict:
					require.Equal(t, "version_conflict", r.ErrorCode(), "%s round %d racer %d", name, round, i)
				default:
					t.Fatalf("%s round %d: racer %d answered %d: %s", name, round, i, r.Status, r.Body)
				}
			}
			require.NotNil(t, winner, "%s round %d: no winner", name, round)
			requireReadsAs(t, e.Env, e.ws.Key, race.path, winner)
		})
	}
}

// Effect-type policy PUTs racing on two instances without an expected
// version all land, one after another: their versions are each one more
// than the version before (one per write, none shared, none skipped), and
// the policy reads as the write with the last version left it.
func TestPolicyPutsRacingWithoutAnExpectedVersionLandInTurn(t *testing.T) {
	t.Parallel()
	e := newJobsEnv(t)
	instances := e.twoInstances()
	race := policyRace{path: "/api/v1/policies/hammer.type", body: func(round, i int) map[string]any {
		return map[string]any{"max_attempts": 1 + (round*policyRacers+i)%50, "required_dimensions": []string{fmt.Sprint("d", round, "-", i)}}
	}}
	racePolicyPuts(instances, e.ws.Key, race, false, func(round int, answers []*apitest.Response) {
		var versions []int
		last := answers[0]
		for i, r := range answers {
			require.Equal(t, http.StatusOK, r.Status, "round %d racer %d: %s", round, i, r.Body)
			require.Equal(t, []any{fmt.Sprint("d", round, "-", i)}, r.JSON()["required_dimensions"], "round %d racer %d", round, i)
			versions = append(versions, versionOf(r))
			if versionOf(r) > versionOf(last) {
				last = r
			}
		}
		sort.Ints(versions)
		for i, v := range versions {
			require.Equal(t, round*policyRacers+i+1, v, "round %d: versions %v", round, versions)
		}
		requireReadsAs(t, e.Env, e.ws.Key, race.path, last)
	})
}
