//! RoCEv2 wire formats (IBTA Vol 1 ch. 9 + Annex A17): typed views and reprs.
#![forbid(unsafe_code)]
