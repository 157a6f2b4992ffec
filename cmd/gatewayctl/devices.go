package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"greenhouse-gateway/firmware-contract"
)

// resetKeyAnswer is the answer of POST /v1/devices/{hardware_id}/reset-key.
type resetKeyAnswer struct {
	HardwareID string `json:"hardware_id"`
	Status     string `json:"status"`
	// RevokedKeyID is the key_id of the device key revoked; null when the
	// device had none.
	RevokedKeyID *string `json:"revoked_key_id"`
}

func setupDevicesResetKey(fs *flag.FlagSet, getenv func(string) string) func(context.Context, *cmdEnv, []string) error {
	api := registerAPIFlags(fs, getenv, defaultURL)
	return func(ctx context.Context, env *cmdEnv, pos []string) error {
		hw := pos[0]
		if err := contract.ValidHardwareID(hw); err != nil {
			return usageError{msg: "HW: " + contract.AsError(err).Rule}
		}
		c, err := api.client(env)
		if err != nil {
			return err
		}
		var answer resetKeyAnswer
		err = c.do(ctx, http.MethodPost, "/v1/devices/"+url.PathEscape(hw)+"/reset-key", true, &answer)
		if errors.Is(err, errNotAvailable) {
			return fmt.Errorf("gatewayd at %s has no reset-key route (an older gatewayd, without device keys)", c.base)
		}
		if err != nil {
			return err
		}
		printResetKey(env.stdout, answer)
		return nil
	}
}

func printResetKey(w io.Writer, a resetKeyAnswer) {
	if a.RevokedKeyID == nil {
		fmt.Fprintf(w, "%s had no device key; nothing revoked. Its next registration with a fleet key enrolls it.\n",
			a.HardwareID)
		return
	}
	fmt.Fprintf(w, "revoked device key %s of %s: refused by the gateway now, and in api_keys once its uplink "+
		"has written it. The device's next registration with a fleet key enrolls it again and answers a new device key.\n",
		*a.RevokedKeyID, a.HardwareID)
}
