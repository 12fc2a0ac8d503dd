"""Test-only: makes a fresh interpreter read gpuguard_auto.pth from the source tree, as an installed gpuguard's
site-packages would (``site.addsitedir`` processes .pth files exactly as at start-up). Put this folder first
on PYTHONPATH and name the folder holding the .pth in GPUGUARD_TEST_SITE."""

import os
import site

if os.environ.get("GPUGUARD_TEST_SITE"):
    site.addsitedir(os.environ["GPUGUARD_TEST_SITE"])
