"""``fli-observe``: convert numpy convergence maps into an fli observation (``DIR/observation.zarr``) for fli-map.

    fli-observe --kappa kappa.npy --sigma 0.02,0.03 --nz nz.npz \\
        --fov-deg 5 --out DIR [--mask mask.npy]

The format is described in docs/observation.md and read by :func:`fli.store.io.load_observation`.
Every input is validated before anything is written; on an error the script prints one line
and exits with status 2, leaving no output behind.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

DESCRIPTION = """\
Write DIR/observation.zarr, an observation that fli-map can analyse (docs/observation.md).

The observation is a zarr group holding
  kappa_obs    [n_bins, npix, npix] float  observed convergence per tomographic bin
  noise_sigma  [n_bins]                    per-pixel Gaussian shape noise (convergence), > 0
  nz_z, nz     [n_bins, N]                 each bin's redshift grid and n(z) >= 0
  mask         [npix, npix] bool           True = observed (only with --mask)
attributes fli_format, fov_deg (map side in degrees), npix and units, and a COMPLETE marker
written last. fli-map uses these n(z) tables instead of the config's survey bins (the config
must have as many bins), and noise_sigma with the mask as its Gaussian likelihood.
"""

EPILOG = """\
example:
  fli-observe --kappa kappa.npy --sigma 0.02,0.03 \\
      --nz-txt bin0.txt bin1.txt --fov-deg 5 --mask mask.npy --out obs
  fli-map mock=obs lensing.npix=64 lensing.fov_deg=5 ...
"""


class InputError(ValueError):
    """A command-line input is unusable; the message names it."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage block
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="fli-observe", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kappa", required=True, metavar="KAPPA.npy",
                   help="[n_bins, npix, npix] (or [npix, npix] for one bin) float convergence maps; NaN is "
                        "allowed only where --mask is False and is stored as 0")
    p.add_argument("--sigma", required=True, metavar="S0,S1,...|SIGMA.npy",
                   help="per-pixel noise of each bin: comma-separated numbers (one number: every bin) or a "
                        ".npy [n_bins]")
    p.add_argument("--mask", metavar="MASK.npy", help="[npix, npix] boolean (or 0/1) map, True = observed")
    nz = p.add_mutually_exclusive_group(required=True)
    nz.add_argument("--nz", metavar="NZ.npz", help=".npz with z [N] or [n_bins, N] and nz [n_bins, N]")
    nz.add_argument("--nz-txt", nargs="+", metavar="BIN.txt",
                    help="one text file per bin, two columns: z, n(z) (lines starting with # are comments)")
    p.add_argument("--fov-deg", required=True, type=float, help="side of the square map [deg]")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (DIR/observation.zarr)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing DIR/observation.zarr")
    return p.parse_args(argv)


def _load_npy(path: str, flag: str):
    import numpy as np  # noqa: PLC0415

    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise InputError(f"{flag} {path}: cannot read a .npy array ({' '.join(str(e).split())})") from None


def _sigma(text: str):
    import numpy as np  # noqa: PLC0415

    if text.endswith(".npy"):
        return np.asarray(_load_npy(text, "--sigma"), dtype=float).reshape(-1)
    try:
        return np.array([float(s) for s in text.split(",")])
    except ValueError:
        raise InputError(f"--sigma {text!r}: give comma-separated numbers or a .npy file") from None


def _nz_tables(args):
    """(z [N] or [n_bins, N], nz [n_bins, N], name of the source for messages)."""
    import numpy as np  # noqa: PLC0415

    if args.nz is not None:
        try:
            f = np.load(args.nz, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise InputError(f"--nz {args.nz}: cannot read an .npz file ({' '.join(str(e).split())})") from None
        if not isinstance(f, np.lib.npyio.NpzFile) or "z" not in f or "nz" not in f:
            held = sorted(f.files) if isinstance(f, np.lib.npyio.NpzFile) else "one array (.npy)"
            raise InputError(f"--nz {args.nz} holds {held}: it needs an .npz with arrays 'z' [N] or [n_bins, N] "
                             f"and 'nz' [n_bins, N]")
        with f:
            z, nz = np.asarray(f["z"], dtype=float), np.asarray(f["nz"], dtype=float)
        if nz.ndim == 1:
            nz = nz[None, :]
        if z.ndim == 1:
            z = np.broadcast_to(z, nz.shape).copy() if z.shape[0] == nz.shape[-1] else z[None, :]
        return z, nz, f"--nz {args.nz}"
    zs, ns = [], []
    for path in args.nz_txt:
        try:
            t = np.loadtxt(path, ndmin=2)
        except (OSError, ValueError) as e:
            raise InputError(f"--nz-txt {path}: cannot read two columns z, n(z) ({' '.join(str(e).split())})") \
                from None
        if t.shape[1] != 2 or t.shape[0] < 2:
            raise InputError(f"--nz-txt {path}: need two columns z, n(z) and at least 2 rows, got {list(t.shape)}")
        zs.append(t[:, 0])
        ns.append(t[:, 1])
    if len({len(z) for z in zs}) > 1:  # tables of different lengths: each onto N_Z uniform points
        from fli.lensing.survey import table_bin  # noqa: PLC0415 - what load_observation does to other lengths

        bins = [table_bin(z, v, label=f"--nz-txt {path}") for z, v, path in zip(zs, ns, args.nz_txt)]
        zs, ns = [b.z for b in bins], [b.nz for b in bins]
    return np.stack(zs), np.stack(ns), "--nz-txt " + " ".join(args.nz_txt)


def build(args):
    """The arrays of the observation, from the command line (nothing is written)."""
    import numpy as np  # noqa: PLC0415

    kappa = _load_npy(args.kappa, "--kappa")
    if kappa.ndim == 2:
        kappa = kappa[None]
    if not np.issubdtype(kappa.dtype, np.floating):
        raise InputError(f"--kappa {args.kappa} has dtype {kappa.dtype}: it must be float32 or float64")
    mask = None
    if args.mask is not None:
        mask = _load_npy(args.mask, "--mask")
        if mask.dtype != bool and np.issubdtype(mask.dtype, np.integer) and np.all(np.isin(mask, (0, 1))):
            mask = mask.astype(bool)
        if mask.dtype == bool and mask.shape == kappa.shape[-2:]:
            kappa = np.where(mask, kappa, kappa.dtype.type(0))  # NaN allowed where unobserved
    sigma = _sigma(args.sigma)
    if sigma.size == 1 and kappa.ndim == 3:
        sigma = np.repeat(sigma, kappa.shape[0])
    z, nz, nz_src = _nz_tables(args)
    if args.nz_txt is not None and len(args.nz_txt) != kappa.shape[0] and kappa.ndim == 3:
        raise InputError(f"--nz-txt gives {len(args.nz_txt)} file(s) but --kappa {args.kappa} has "
                         f"{kappa.shape[0]} bin(s): give one file per bin")
    sources = {"kappa_obs": f"--kappa {args.kappa}", "noise_sigma": f"--sigma {args.sigma}",
               "mask": f"--mask {args.mask}", "nz_z": nz_src + " (z)", "nz": nz_src + " (n(z))",
               "nz_z/nz": nz_src, "fov_deg": "--fov-deg", "npix": f"--kappa {args.kappa} (npix)"}
    return dict(kappa_obs=kappa, noise_sigma=sigma, nz_z=z, nz=nz, fov_deg=args.fov_deg, mask=mask), sources


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a host-side conversion: leave accelerators alone
    from fli.store.io import OBSERVATION_NAME, MockError, write_observation  # noqa: PLC0415

    out = Path(args.out)
    made_out = not out.exists()
    try:
        arrays, sources = build(args)
        group = out / OBSERVATION_NAME
        if group.exists() and not args.overwrite:
            raise InputError(f"--out {out}: {group} exists: remove it, choose another --out or pass --overwrite")
        write_observation(group, **arrays, sources=sources, overwrite=args.overwrite,
                          attrs={"source": {"kappa": args.kappa, "sigma": args.sigma, "mask": args.mask,
                                            "nz": args.nz or args.nz_txt}})
    except (InputError, MockError, ValueError, OSError) as e:
        if made_out and out.exists():
            shutil.rmtree(out, ignore_errors=True)
        print(f"fli-observe: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print(f"wrote {group}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
