#!/bin/sh
echo smoke ok
